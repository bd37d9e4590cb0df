! tiermem's Fortran module: the C API (tiermem.h) through iso_c_binding. Constants mirror
! the header's (tests/capi/test_fortran.py checks every one against it). Objects are
! pinned to an address (tm_pin) that c_f_pointer turns into a Fortran pointer of any rank
! and kind; see examples/fortran/stream.f90.
module tiermem
  use, intrinsic :: iso_c_binding
  implicit none

  ! tm_status
  integer(c_int), parameter, public :: TM_OK = 0
  integer(c_int), parameter, public :: TM_INVALID_ARGUMENT = 1
  integer(c_int), parameter, public :: TM_UNKNOWN_DEVICE = 2
  integer(c_int), parameter, public :: TM_DEVICE_FULL = 3
  integer(c_int), parameter, public :: TM_PINNED = 4
  integer(c_int), parameter, public :: TM_NO_SUCH_OBJECT = 5
  integer(c_int), parameter, public :: TM_IO = 6
  integer(c_int), parameter, public :: TM_GUARD = 7
  integer(c_int), parameter, public :: TM_POISONED = 8
  integer(c_int), parameter, public :: TM_CORRUPT = 9
  integer(c_int), parameter, public :: TM_PANIC = 10
  integer(c_int), parameter, public :: TM_OTHER = 11

  ! place codes
  integer(c_int64_t), parameter, public :: TM_PLACE_FAST = -1
  integer(c_int64_t), parameter, public :: TM_PLACE_SLOW = -2
  integer(c_int64_t), parameter, public :: TM_PLACE_AUTO = -3

  ! One device: spec (a NUL-terminated string, see tm_cstring) and capacity in bytes.
  type, bind(c), public :: tm_device
    type(c_ptr) :: spec
    integer(c_int64_t) :: bytes
  end type tm_device

  interface
    integer(c_int) function tm_manager_new(devices, n, policy, out) bind(c, name="tm_manager_new")
      import :: tm_device, c_size_t, c_ptr, c_int
      type(tm_device), intent(in) :: devices(*)
      integer(c_size_t), value :: n
      type(c_ptr), value :: policy
      type(c_ptr), intent(out) :: out
    end function
    subroutine tm_manager_free(m) bind(c, name="tm_manager_free")
      import :: c_ptr
      type(c_ptr), value :: m
    end subroutine
    integer(c_int) function tm_device_count(m, count) bind(c, name="tm_device_count")
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: m
      integer(c_size_t), intent(out) :: count
    end function
    integer(c_int) function tm_alloc(m, bytes, place_code, id) bind(c, name="tm_alloc")
      import :: c_ptr, c_int64_t, c_int
      type(c_ptr), value :: m
      integer(c_int64_t), value :: bytes, place_code
      integer(c_int64_t), intent(out) :: id
    end function
    integer(c_int) function tm_free(m, id) bind(c, name="tm_free")
      import :: c_ptr, c_int64_t, c_int
      type(c_ptr), value :: m
      integer(c_int64_t), value :: id
    end function
    integer(c_int) function tm_pin(m, id, write, addr, bytes, ticket) bind(c, name="tm_pin")
      import :: c_ptr, c_int64_t, c_int32_t, c_size_t, c_int
      type(c_ptr), value :: m
      integer(c_int64_t), value :: id
      integer(c_int32_t), value :: write
      type(c_ptr), intent(out) :: addr
      integer(c_size_t), intent(out) :: bytes
      integer(c_int64_t), intent(out) :: ticket
    end function
    integer(c_int) function tm_unpin(m, ticket) bind(c, name="tm_unpin")
      import :: c_ptr, c_int64_t, c_int
      type(c_ptr), value :: m
      integer(c_int64_t), value :: ticket
    end function
    integer(c_int) function tm_move(m, id, place_code) bind(c, name="tm_move")
      import :: c_ptr, c_int64_t, c_int
      type(c_ptr), value :: m
      integer(c_int64_t), value :: id, place_code
    end function
    integer(c_int) function tm_device_of(m, id, device) bind(c, name="tm_device_of")
      import :: c_ptr, c_int64_t, c_size_t, c_int
      type(c_ptr), value :: m
      integer(c_int64_t), value :: id
      integer(c_size_t), intent(out) :: device
    end function
    integer(c_int) function tm_charge(m, charges, n, threads) bind(c, name="tm_charge")
      import :: c_ptr, c_int64_t, c_size_t, c_int
      type(c_ptr), value :: m
      integer(c_int64_t), intent(in) :: charges(*)
      integer(c_size_t), value :: n, threads
    end function
    type(c_ptr) function tm_last_error_c() bind(c, name="tm_last_error")
      import :: c_ptr
    end function
  end interface

  public :: tm_manager_new, tm_manager_free, tm_device_count, tm_alloc, tm_free, tm_pin, &
            tm_unpin, tm_move, tm_device_of, tm_charge, tm_last_error, tm_cstring

contains

  ! A NUL-terminated copy of s, to keep alive while C reads it (take c_loc of it).
  function tm_cstring(s) result(c)
    character(len=*), intent(in) :: s
    character(kind=c_char), allocatable, target :: c(:)
    integer :: i
    allocate (c(len_trim(s) + 1))
    do i = 1, len_trim(s)
      c(i) = s(i:i)
    end do
    c(len_trim(s) + 1) = c_null_char
  end function

  ! This thread's last failure's message ('' if none failed).
  function tm_last_error() result(msg)
    character(len=:), allocatable :: msg
    type(c_ptr) :: p
    character(kind=c_char), pointer :: chars(:)
    integer :: n
    interface
      integer(c_size_t) function strlen(s) bind(c, name="strlen")
        import :: c_ptr, c_size_t
        type(c_ptr), value :: s
      end function
    end interface
    p = tm_last_error_c()
    if (.not. c_associated(p)) then
      msg = ''
      return
    end if
    n = int(strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate (character(len=n) :: msg)
    msg = transfer(chars, msg)
  end function
end module tiermem
