# The binary package: `cpack -G DEB` in the build tree makes kernel-hub_<version>_<arch>.deb from
# the install rules (install.cmake), under /usr.
#
# Depends: dpkg-shlibdeps computes what the binaries link (libc6, libstdc++6, libssl3 for
# libcrypto, libfmt). It cannot see the libraries loaded with dlopen on first use, so they are
# added here: every soname the hub opens with DynamicLibrary (hub/transport/curl_api.cpp,
# hub/store/archive_api.cpp, read from the sources, so a new one is not forgotten) plus
# libzstd.so.1, which libarchive needs for the tar+zstd package archives; each is mapped to the
# Debian package that ships it on this machine (dpkg -S). libcuda and NVRTC are optional (GPU
# only) and not dependencies.
file(GLOB_RECURSE kh_hub_sources ${PROJECT_SOURCE_DIR}/hub/*.cpp)
set(kh_dlopened "libzstd.so.1")
foreach(source ${kh_hub_sources})
  file(STRINGS ${source} lines REGEX "DynamicLibrary [a-z_]+\\(\"[^\"]+\"")
  foreach(line ${lines})
    string(REGEX REPLACE ".*DynamicLibrary [a-z_]+\\(\"([^\"]+)\".*" "\\1" soname "${line}")
    list(APPEND kh_dlopened ${soname})
  endforeach()
endforeach()
list(REMOVE_DUPLICATES kh_dlopened)

find_program(KH_DPKG dpkg)
set(kh_deb_depends "")
if(KH_DPKG)
  foreach(soname ${kh_dlopened})
    find_library(kh_dlopen_${soname} NAMES ${soname} NO_CACHE)
    if(NOT kh_dlopen_${soname})
      message(FATAL_ERROR "The .deb's dependencies: ${soname} (loaded at run time) is not "
                          "installed here; install its package (tools/bootstrap).")
    endif()
    # dpkg knows a library by the path its package installed (/usr/lib or /lib, merged /usr).
    get_filename_component(real ${kh_dlopen_${soname}} REALPATH)
    set(package "")
    foreach(candidate ${kh_dlopen_${soname}} ${real})
      execute_process(COMMAND ${KH_DPKG} -S ${candidate} OUTPUT_VARIABLE owner
                      ERROR_QUIET RESULT_VARIABLE rc)
      if(rc EQUAL 0 AND owner MATCHES "^([^:, ]+)")
        set(package ${CMAKE_MATCH_1})
        break()
      endif()
    endforeach()
    if(NOT package)
      message(FATAL_ERROR "The .deb's dependencies: no Debian package owns ${soname} "
                          "(${kh_dlopen_${soname}}); dpkg -S found none.")
    endif()
    list(APPEND kh_deb_depends ${package})
  endforeach()
endif()
list(JOIN kh_deb_depends ", " KH_DEB_DLOPEN_DEPENDS)

set(CPACK_PACKAGE_NAME kernel-hub)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "kernel hub and dynamic loading system for CUDA kernels (SDK and CLI)")
set(CPACK_PACKAGE_CONTACT "kernel-hub maintainers")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "${KH_DEB_DLOPEN_DEPENDS}")
include(CPack)
