# kernel_hub_add_package(): builds a kernel package directory against the kernel-hub SDK.
# Installed as lib/cmake/KernelHub/KernelHubPackage.cmake; find_package(KernelHub) includes it
# after defining KernelHub::package (the ABI header and the host library build flags). It finds
# the SDK's kernel-hub CLI relative to this file, so a moved prefix still works.
#
#   kernel_hub_add_package(<target>
#     SOURCES host.cpp ...          # the host library's sources
#     [DEVICE_SOURCE kernels.cu]    # device source; `#include "x.cuh"` of files beside it are
#                                   # inlined, so the shipped .cu is header-free
#     [MANIFEST kernel.json.in]     # default kernel.json.in: name, version, host_library
#                                   # (lib<name>.so), cuda_source, ... without layers and files
#     [OUTPUT_DIR dir])             # default ${CMAKE_CURRENT_BINARY_DIR}/package
#
# OUTPUT_DIR then holds the package as `kernel-hub check`, `kernel-hub pack` and
# KERNEL_HUB_LOCAL take it: the host library, the device source (named as cuda_source says) and
# kernel.json, written by `kernel-hub manifest` with the layers the library's module table
# declares and every file's SHA-256. The sources get KH_PACKAGE_NAME and KH_PACKAGE_VERSION
# from the manifest, so the two are written once. Targets: <target> (the library) and
# <target>_package (the directory; built by `all`).
include_guard(GLOBAL)

set(_KH_PACKAGE_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")

# The CLI that writes kernel.json: KERNEL_HUB_EXECUTABLE if set, else the SDK's imported
# KernelHub::kernel-hub, else a kernel-hub in the SDK's bin/ or on PATH.
if(NOT KERNEL_HUB_EXECUTABLE AND NOT TARGET KernelHub::kernel-hub)
  find_program(KERNEL_HUB_EXECUTABLE kernel-hub HINTS "${_KH_PACKAGE_CMAKE_DIR}/../../../bin"
               DOC "The kernel-hub CLI that writes package manifests")
endif()

# Reads key of the manifest's JSON text into out ("" when absent and not required).
function(_kernel_hub_manifest_field text manifest key required out)
  string(JSON value ERROR_VARIABLE error GET "${text}" "${key}")
  if(error OR value STREQUAL "")
    if(required)
      message(FATAL_ERROR "kernel_hub_add_package: ${manifest}: \"${key}\" is missing or empty; "
                          "the manifest needs name, version and host_library (lib<name>.so)")
    endif()
    set(value "")
  endif()
  set(${out} "${value}" PARENT_SCOPE)
endfunction()

function(kernel_hub_add_package target)
  cmake_parse_arguments(P "" "DEVICE_SOURCE;MANIFEST;OUTPUT_DIR" "SOURCES" ${ARGN})
  if(P_UNPARSED_ARGUMENTS OR NOT P_SOURCES)
    message(FATAL_ERROR "kernel_hub_add_package(${target}): expected SOURCES ... [DEVICE_SOURCE "
                        "file.cu] [MANIFEST kernel.json.in] [OUTPUT_DIR dir], got: ${ARGN}")
  endif()
  if(NOT TARGET KernelHub::package)
    message(FATAL_ERROR "kernel_hub_add_package(${target}): KernelHub::package is not defined; "
                        "call find_package(KernelHub) first")
  endif()
  if(KERNEL_HUB_EXECUTABLE)
    set(cli "${KERNEL_HUB_EXECUTABLE}")
  elseif(TARGET KernelHub::kernel-hub)
    set(cli "$<TARGET_FILE:KernelHub::kernel-hub>")
  else()
    message(FATAL_ERROR "kernel_hub_add_package(${target}): the kernel-hub CLI was not found "
                        "beside this SDK (${_KH_PACKAGE_CMAKE_DIR}/../../../bin) nor on PATH; "
                        "set KERNEL_HUB_EXECUTABLE")
  endif()
  if(NOT P_MANIFEST)
    set(P_MANIFEST kernel.json.in)
  endif()
  if(NOT P_OUTPUT_DIR)
    set(P_OUTPUT_DIR "${CMAKE_CURRENT_BINARY_DIR}/package")
  endif()
  get_filename_component(manifest "${P_MANIFEST}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  set(dir "${P_OUTPUT_DIR}")

  # Name, version and file names, written once in the manifest.
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${manifest}")
  file(READ "${manifest}" text)
  _kernel_hub_manifest_field("${text}" "${manifest}" name ON name)
  _kernel_hub_manifest_field("${text}" "${manifest}" version ON version)
  _kernel_hub_manifest_field("${text}" "${manifest}" host_library ON host_library)
  _kernel_hub_manifest_field("${text}" "${manifest}" cuda_source OFF cuda_source)
  if(NOT host_library MATCHES "^lib([^/]+)\\.so$")
    message(FATAL_ERROR "kernel_hub_add_package(${target}): ${manifest}: host_library "
                        "'${host_library}' must be a file name lib<name>.so")
  endif()
  set(library_name "${CMAKE_MATCH_1}")
  if(P_DEVICE_SOURCE AND cuda_source STREQUAL "")
    message(FATAL_ERROR "kernel_hub_add_package(${target}): DEVICE_SOURCE is given but "
                        "${manifest} has no \"cuda_source\" (the file name it ships as)")
  elseif(NOT P_DEVICE_SOURCE AND NOT cuda_source STREQUAL "")
    message(FATAL_ERROR "kernel_hub_add_package(${target}): ${manifest} names cuda_source "
                        "'${cuda_source}' but no DEVICE_SOURCE is given")
  endif()

  # The host library: the SDK's flags (hidden visibility, kh_module_v1 exported alone, no
  # CUDA runtime), no SONAME or rpath, written straight into the package directory.
  add_library(${target} SHARED ${P_SOURCES})
  target_link_libraries(${target} PRIVATE KernelHub::package)
  target_compile_definitions(${target} PRIVATE KH_PACKAGE_NAME="${name}"
                                               KH_PACKAGE_VERSION="${version}")
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME "${library_name}" PREFIX "lib" SUFFIX ".so" NO_SONAME ON SKIP_BUILD_RPATH ON
    LIBRARY_OUTPUT_DIRECTORY "${dir}")

  set(package_files "")
  if(P_DEVICE_SOURCE)
    get_filename_component(device_source "${P_DEVICE_SOURCE}" ABSOLUTE
                           BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    get_filename_component(device_dir "${device_source}" DIRECTORY)
    file(GLOB device_headers CONFIGURE_DEPENDS "${device_dir}/*.h" "${device_dir}/*.cuh")
    add_custom_command(
      OUTPUT "${dir}/${cuda_source}"
      COMMAND "${CMAKE_COMMAND}" "-DIN=${device_source}" "-DOUT=${dir}/${cuda_source}"
              "-DINCLUDE_DIR=${device_dir}"
              -P "${_KH_PACKAGE_CMAKE_DIR}/KernelHubExpandIncludes.cmake"
      DEPENDS "${device_source}" ${device_headers}
              "${_KH_PACKAGE_CMAKE_DIR}/KernelHubExpandIncludes.cmake"
      COMMENT "Writing the header-free ${cuda_source}")
    list(APPEND package_files "${dir}/${cuda_source}")
  endif()
  add_custom_command(
    OUTPUT "${dir}/kernel.json"
    COMMAND "${cli}" manifest "${dir}" --template "${manifest}"
    DEPENDS ${target} ${package_files} "${manifest}" "${cli}"
    COMMENT "Writing kernel.json for ${name} ${version}")
  add_custom_target(${target}_package ALL DEPENDS "${dir}/kernel.json" ${package_files})
endfunction()
