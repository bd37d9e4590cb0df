! STREAM triad (a = b + s*c) in Fortran over arrays tiermem places: objects allocated on
! DRAM, pinned to Fortran pointers (c_f_pointer: any rank and kind; b is used as a 2-D
! array to show it), run, moved to the slow device, run again, results checked.
! Build: gfortran -I<dir of tiermem.mod> stream.f90 $(pkg-config --libs tiermem)
program stream
  use, intrinsic :: iso_c_binding
  use tiermem
  implicit none
  integer, parameter :: n = 200000, rows = 400
  integer(c_int64_t), parameter :: bytes = int(n, c_int64_t) * 8
  type(tm_device), target :: devs(2)
  character(kind=c_char), allocatable, target :: dram(:), slow(:), policy(:)
  type(c_ptr) :: m, p
  integer(c_int64_t) :: ids(3), tickets(3), charges(9)
  integer(c_size_t) :: len, dev
  real(c_double), pointer :: a(:), b2(:, :), c(:)
  integer :: k, i, pass

  dram = tm_cstring('dram')
  slow = tm_cstring('emulated:optane-pmem')
  policy = tm_cstring('lru_in_place')
  devs(1) = tm_device(c_loc(dram), 3 * bytes + 1048576)
  devs(2) = tm_device(c_loc(slow), 3 * bytes + 1048576)
  call check(tm_manager_new(devs, 2_c_size_t, c_loc(policy), m), 'tm_manager_new')
  do k = 1, 3
    call check(tm_alloc(m, bytes, TM_PLACE_FAST, ids(k)), 'tm_alloc')
  end do
  do pass = 1, 2
    call check(tm_pin(m, ids(1), 1_c_int32_t, p, len, tickets(1)), 'tm_pin a')
    call c_f_pointer(p, a, [n])
    call check(tm_pin(m, ids(2), 1_c_int32_t, p, len, tickets(2)), 'tm_pin b')
    call c_f_pointer(p, b2, [rows, n / rows])
    call check(tm_pin(m, ids(3), 1_c_int32_t, p, len, tickets(3)), 'tm_pin c')
    call c_f_pointer(p, c, [n])
    if (pass == 1) then
      do i = 1, n
        b2(mod(i - 1, rows) + 1, (i - 1) / rows + 1) = real(i, c_double)
        c(i) = 2.0_c_double
      end do
    end if
    do i = 1, n
      a(i) = b2(mod(i - 1, rows) + 1, (i - 1) / rows + 1) + 3.0_c_double * c(i)
    end do
    charges = [ids(1), 0_c_int64_t, bytes, ids(2), bytes, 0_c_int64_t, ids(3), bytes, 0_c_int64_t]
    call check(tm_charge(m, charges, 3_c_size_t, 1_c_size_t), 'tm_charge')
    do i = 1, n
      if (a(i) /= real(i, c_double) + 6.0_c_double) then
        print '(a, i0)', 'wrong result at ', i
        stop 1
      end if
    end do
    do k = 1, 3
      call check(tm_unpin(m, tickets(k)), 'tm_unpin')
    end do
    if (pass == 1) then
      do k = 1, 3
        call check(tm_move(m, ids(k), TM_PLACE_SLOW), 'tm_move')
      end do
    end if
  end do
  call check(tm_device_of(m, ids(1), dev), 'tm_device_of')
  ! A refused call: its status and message.
  if (tm_free(m, 999999_c_int64_t) /= TM_NO_SUCH_OBJECT) stop 2
  print '(a, i0, a, a)', 'fortran triad checked on dram and on device ', dev, '; refused free: ', tm_last_error()
  do k = 1, 3
    call check(tm_free(m, ids(k)), 'tm_free')
  end do
  call tm_manager_free(m)

contains
  subroutine check(status, what)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: what
    if (status /= TM_OK) then
      print '(a, a, i0, a, a)', what, ' failed: ', status, ': ', tm_last_error()
      stop 1
    end if
  end subroutine
end program stream
