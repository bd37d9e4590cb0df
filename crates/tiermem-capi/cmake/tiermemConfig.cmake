# tiermem's CMake package (installed by `make install` into PREFIX/lib/cmake/tiermem):
#   find_package(tiermem REQUIRED)
#   target_link_libraries(app PRIVATE tiermem::tiermem)          # libtiermem.so
#   target_link_libraries(app PRIVATE tiermem::tiermem_static)   # libtiermem.a
# Both bring the include directory of tiermem.h, h2m.h and tiermem.f90. Relocatable: the
# prefix is found from this file's place.
get_filename_component(_tiermem_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET tiermem::tiermem)
  add_library(tiermem::tiermem SHARED IMPORTED)
  set_target_properties(tiermem::tiermem PROPERTIES
    IMPORTED_LOCATION "${_tiermem_prefix}/lib/libtiermem.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_tiermem_prefix}/include")
  add_library(tiermem::tiermem_static STATIC IMPORTED)
  set_target_properties(tiermem::tiermem_static PROPERTIES
    IMPORTED_LOCATION "${_tiermem_prefix}/lib/libtiermem.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_tiermem_prefix}/include"
    INTERFACE_LINK_LIBRARIES "pthread;dl;m")
endif()
unset(_tiermem_prefix)
