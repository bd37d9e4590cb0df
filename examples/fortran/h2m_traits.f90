! The H2M interface from Fortran: a rank-2 real(8) matrix and a rank-1 integer array placed
! by traits (the matrix in the high-bandwidth space at priority 15, the array in the
! large-capacity one), the matrix's traits changed to large_cap and migrated, its values
! read through the same pointer afterwards, and both freed.
! Build: gfortran -I<dir of h2m.mod> h2m_traits.f90 h2m.o $(pkg-config --libs tiermem)
! Usage: h2m_traits (TIERMEM_SYSFS=<fixture> to place as on another machine)
program h2m_traits
  use, intrinsic :: iso_c_binding
  use h2m
  implicit none
  integer, parameter :: n = 300
  type(c_ptr) :: pa, pb
  real(c_double), pointer :: a(:, :)
  integer(c_int), pointer :: b(:)
  type(h2m_alloc_trait_t) :: hot(2), cold(1)
  integer(c_int) :: err, rc, before, after, i, j

  call check(h2m_init(), "h2m_init")
  hot(1) = h2m_trait(h2m_atk_pref_mem_space, h2m_atv_mem_space_hbw)
  hot(2) = h2m_trait_real(h2m_atk_access_prio, 15.0_c_double)
  pa = h2m_alloc_w_traits(int(n, c_size_t) * n * 8, err, 2, hot)
  call check(err, "h2m_alloc_w_traits(a)")
  cold(1) = h2m_trait(h2m_atk_pref_mem_space, h2m_atv_mem_space_large_cap)
  pb = h2m_alloc_w_traits(int(n, c_size_t) * 4, err, 1, cold)
  call check(err, "h2m_alloc_w_traits(b)")
  call c_f_pointer(pa, a, [n, n])
  call c_f_pointer(pb, b, [n])
  do j = 1, n
    b(j) = j
    do i = 1, n
      a(i, j) = real(i + j, c_double)
    end do
  end do
  call check(tm_h2m_node_of(pa, before), "tm_h2m_node_of")
  call check(h2m_update_traits(pa, int(n, c_size_t) * n * 8, 1, cold, 1), "h2m_update_traits")
  call check(h2m_apply_migration(), "h2m_apply_migration")
  call check(tm_h2m_node_of(pa, after), "tm_h2m_node_of")
  do j = 1, n
    if (b(j) /= j .or. abs(a(n, j) - real(n + j, c_double)) > 0) then
      print '(a, i0)', "wrong value after migration in column ", j
      stop 1
    end if
  end do
  print '(a, i0, a, i0, a, f10.1)', "a moved from node ", before, " to node ", after, &
      "; sum ", sum(a)
  call check(h2m_free(pa), "h2m_free(a)")
  call check(h2m_free(pb), "h2m_free(b)")
  rc = h2m_free(pb)
  if (rc /= H2M_NO_SUCH_ALLOCATION) stop 2
  call check(h2m_finalize(), "h2m_finalize")
  print '(a)', "allocated, migrated, freed; results checked"
contains
  subroutine check(code, what)
    integer(c_int), intent(in) :: code
    character(*), intent(in) :: what
    if (code /= H2M_SUCCESS) then
      print '(a, a, i0)', what, " failed: ", code
      stop 1
    end if
  end subroutine
end program h2m_traits
