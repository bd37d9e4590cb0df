! The H2M interface (h2m.h) for Fortran through iso_c_binding: the calls, the codes, the
! trait keys and values as named constants (tests/capi/test_fortran.py checks every one
! against the generated header), and h2m_trait / h2m_trait_real to build a trait (Fortran
! has no unions: the value is its eight bytes). An allocation's c_ptr becomes a Fortran
! pointer of any rank and kind with c_f_pointer; it stays valid across h2m_apply_migration.
! See examples/fortran/h2m_traits.f90.
module h2m
  use, intrinsic :: iso_c_binding
  implicit none

  integer(c_int), parameter, public :: H2M_SUCCESS = 0
  integer(c_int), parameter, public :: H2M_FAILURE = 1
  integer(c_int), parameter, public :: H2M_INVALID_ARGUMENT = 2
  integer(c_int), parameter, public :: H2M_OUT_OF_MEMORY = 3
  integer(c_int), parameter, public :: H2M_NO_SUCH_ALLOCATION = 4
  integer(c_int), parameter, public :: H2M_NOT_INITIALIZED = 5
  integer(c_int), parameter, public :: H2M_ALREADY_INITIALIZED = 6
  integer(c_int), parameter, public :: H2M_FORKED = 7
  integer(c_int), parameter, public :: H2M_PANIC = 8
  integer(c_int), parameter, public :: h2m_atk_req_mem_space = 1
  integer(c_int), parameter, public :: h2m_atk_pref_mem_space = 2
  integer(c_int), parameter, public :: h2m_atk_mem_alignment = 3
  integer(c_int), parameter, public :: h2m_atk_sensitivity = 4
  integer(c_int), parameter, public :: h2m_atk_access_mode = 5
  integer(c_int), parameter, public :: h2m_atk_access_freq = 6
  integer(c_int), parameter, public :: h2m_atk_access_prio = 7
  integer(c_int), parameter, public :: h2m_atk_access_pattern = 8
  integer(c_int), parameter, public :: h2m_atk_access_stride = 9
  integer(c_int), parameter, public :: h2m_atk_structure_type = 10
  integer(c_int), parameter, public :: h2m_atk_gain = 100
  integer(c_int), parameter, public :: h2m_atk_fallback = 101
  integer(c_int), parameter, public :: h2m_atk_mem_partition = 102
  integer(c_int), parameter, public :: h2m_atk_mem_pinned = 103
  integer(c_int), parameter, public :: h2m_atv_mem_space_hbw = 1
  integer(c_int), parameter, public :: h2m_atv_mem_space_low_lat = 2
  integer(c_int), parameter, public :: h2m_atv_mem_space_large_cap = 4
  integer(c_int), parameter, public :: h2m_atv_bw_sensitive = 8
  integer(c_int), parameter, public :: h2m_atv_lat_sensitive = 16
  integer(c_int), parameter, public :: h2m_atv_access_mode_readonly = 32
  integer(c_int), parameter, public :: h2m_atv_access_mode_writeonly = 64
  integer(c_int), parameter, public :: h2m_atv_access_mode_readwrite = 128
  integer(c_int), parameter, public :: h2m_atv_access_pattern_sequential = 256
  integer(c_int), parameter, public :: h2m_atv_access_pattern_strided = 512
  integer(c_int), parameter, public :: h2m_atv_access_pattern_random = 1024
  integer(c_int), parameter, public :: h2m_atv_structure_array = 2048
  integer(c_int), parameter, public :: h2m_atv_structure_matrix = 4096
  integer(c_int), parameter, public :: h2m_atv_structure_sparse = 8192
  integer(c_int), parameter, public :: h2m_atv_structure_tree = 16384
  integer(c_int), parameter, public :: h2m_atv_structure_hash = 32768
  integer(c_int), parameter, public :: h2m_atv_structure_graph = 65536
  integer(c_int), parameter, public :: h2m_atv_fallback_next_best = 131072
  integer(c_int), parameter, public :: h2m_atv_fallback_error = 262144
  integer(c_int), parameter, public :: h2m_atv_partition_nearest = 524288
  integer(c_int), parameter, public :: h2m_atv_partition_blocked = 1048576
  integer(c_int), parameter, public :: h2m_atv_partition_interleaved = 2097152
  integer(c_int), parameter, public :: H2M_STRATEGY_FIFO = 0
  integer(c_int), parameter, public :: H2M_STRATEGY_SIZE = 1
  integer(c_int), parameter, public :: H2M_STRATEGY_PRIORITY = 2
  integer(c_int), parameter, public :: H2M_STRATEGY_GAIN = 3

  ! One trait: a key (h2m_atk_*) and its value's eight bytes (the C union).
  type, bind(c), public :: h2m_alloc_trait_t
    integer(c_int) :: key
    integer(c_int64_t) :: value
  end type h2m_alloc_trait_t

  interface
    integer(c_int) function h2m_init() bind(c, name="h2m_init")
      import :: c_int
    end function
    integer(c_int) function h2m_finalize() bind(c, name="h2m_finalize")
      import :: c_int
    end function
    type(c_ptr) function h2m_alloc_w_traits(size, err, n_traits, traits) bind(c, name="h2m_alloc_w_traits")
      import :: c_ptr, c_size_t, c_int, h2m_alloc_trait_t
      integer(c_size_t), value :: size
      integer(c_int), intent(out) :: err
      integer(c_int), value :: n_traits
      type(h2m_alloc_trait_t), intent(in) :: traits(*)
    end function
    integer(c_int) function h2m_free(ptr) bind(c, name="h2m_free")
      import :: c_ptr, c_int
      type(c_ptr), value :: ptr
    end function
    integer(c_int) function h2m_update_traits(ptr, size, n_traits, traits, replace_complete) &
        bind(c, name="h2m_update_traits")
      import :: c_ptr, c_size_t, c_int, h2m_alloc_trait_t
      type(c_ptr), value :: ptr
      integer(c_size_t), value :: size
      integer(c_int), value :: n_traits, replace_complete
      type(h2m_alloc_trait_t), intent(in) :: traits(*)
    end function
    integer(c_int) function h2m_apply_migration() bind(c, name="h2m_apply_migration")
      import :: c_int
    end function
    integer(c_int) function tm_h2m_node_of(ptr, node) bind(c, name="tm_h2m_node_of")
      import :: c_ptr, c_int
      type(c_ptr), value :: ptr
      integer(c_int), intent(out) :: node
    end function
  end interface

contains

  ! A trait whose value is a constant (h2m_atv_*, OR-ed where the key allows) or a whole
  ! number (a priority, a size).
  function h2m_trait(key, value) result(t)
    integer(c_int), intent(in) :: key
    integer(c_int), intent(in) :: value
    type(h2m_alloc_trait_t) :: t
    t%key = key
    t%value = int(value, c_int64_t)
  end function

  ! A trait whose value is a real (a frequency, a priority, a gain in seconds).
  function h2m_trait_real(key, value) result(t)
    integer(c_int), intent(in) :: key
    real(c_double), intent(in) :: value
    type(h2m_alloc_trait_t) :: t
    t%key = key
    t%value = transfer(value, 0_c_int64_t)
  end function
end module h2m
