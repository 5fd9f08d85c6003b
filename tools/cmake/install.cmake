# The SDK: what `cmake --install build --prefix P` puts in P, and the .deb CPack makes of it.
#   include/kernel_hub/      kernel_hub.h (C API), kernel_hub.hpp + kernel_hub_base.hpp (C++ API),
#                            kernel_hub_abi.h (the package ABI), dlpack/dlpack.h (see below),
#                            kh_prelude.cuh, pdl.cuh, mma.cuh, wgmma.cuh,
#                            cluster.cuh (device code, see below)
#   lib/                     libkernel_hub.so.0.4.0, .so.0 (the SONAME), .so
#   lib/cmake/KernelHub/     KernelHubConfig.cmake (+ Version), KernelHubTargets.cmake (imported
#                            targets KernelHub::kernel_hub, KernelHub::package,
#                            KernelHub::kernel-hub), host_library.map, KernelHubPackage.cmake
#                            (kernel_hub_add_package, installed by the `init` part when present)
#   lib/pkgconfig/           kernel_hub.pc
#   bin/kernel-hub           the CLI
#   share/kernel-hub/        default-hub/ (the signed embedded default hub) and
#                            default-hub-key/signing.pub (its public key; the private half stays
#                            in the build tree)
#   share/man/man1/          kernel-hub.1; bash and zsh completion under share/
# Nothing installed holds a path of the build tree: the binary and the library find
# share/kernel-hub relative to themselves (hub/data_dir.h), so a prefix can be moved.
include(CMakePackageConfigHelpers)

set(KH_INSTALL_INCLUDE_DIR ${CMAKE_INSTALL_INCLUDEDIR}/kernel_hub)

# ---- Headers ----
install(FILES
  ${PROJECT_SOURCE_DIR}/include/kernel_hub/kernel_hub.h
  ${PROJECT_SOURCE_DIR}/include/kernel_hub/kernel_hub.hpp
  ${PROJECT_SOURCE_DIR}/include/kernel_hub/kernel_hub_base.hpp
  ${PROJECT_SOURCE_DIR}/include/kernel_hub/kernel_hub_abi.h
  DESTINATION ${KH_INSTALL_INCLUDE_DIR})
# DLPack: a copy of the one header the ABI was built against, not a dependency on libdlpack-dev.
# The SDK is then complete wherever it is unpacked (a moved prefix, a machine without the -dev
# package, not Debian), and a package author compiles against exactly the DLTensor layout this
# loader reads. include/kernel_hub is on the consumers' include path for it; a program that has
# its own dlpack.h gets one of the two (same include guard; the layout used has been stable
# since DLPack 0.6).
install(FILES ${KH_DLPACK_INCLUDE_DIR}/dlpack/dlpack.h DESTINATION ${KH_INSTALL_INCLUDE_DIR}/dlpack)
# The device-code prelude (bf16/fp16 storage types and conversions, launch helpers) and the
# device headers beside it: pdl.cuh (the device half of KH_LAUNCH_PDL), mma.cuh (cp.async,
# ldmatrix and mma.sync building blocks), wgmma.cuh (Hopper's wgmma) and cluster.cuh (thread
# block clusters): what packages' and runtimes' NVRTC sources inline (a runtime built against the
# SDK needs them too).
install(FILES ${KH_KERNEL_COMMON_DIR}/kh_prelude.cuh ${KH_KERNEL_COMMON_DIR}/pdl.cuh
              ${KH_KERNEL_COMMON_DIR}/mma.cuh ${KH_KERNEL_COMMON_DIR}/wgmma.cuh
              ${KH_KERNEL_COMMON_DIR}/cluster.cuh
        DESTINATION ${KH_INSTALL_INCLUDE_DIR})

# ---- The library and the CLI ----
install(TARGETS kernel_hub EXPORT KernelHubTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kernel-hub EXPORT KernelHubTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# ---- KernelHub::package: build flags for a kernel package's host library ----
# The artifact ABI's rules (kernel_hub_abi.h, REFERENCE §5.3): the ABI header and DLPack, hidden
# visibility, no STB_GNU_UNIQUE, static libstdc++/libgcc, no undefined symbols, and a version
# script exporting only kh_module_v1.
add_library(kh_sdk_package INTERFACE)
set_target_properties(kh_sdk_package PROPERTIES EXPORT_NAME package)
target_include_directories(kh_sdk_package INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<BUILD_INTERFACE:${KH_DLPACK_INCLUDE_DIR}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}> $<INSTALL_INTERFACE:${KH_INSTALL_INCLUDE_DIR}>)
target_compile_options(kh_sdk_package INTERFACE
  -fvisibility=hidden $<$<COMPILE_LANGUAGE:CXX>:-fvisibility-inlines-hidden>
  $<$<COMPILE_LANG_AND_ID:CXX,GNU>:-fno-gnu-unique> $<$<COMPILE_LANG_AND_ID:C,GNU>:-fno-gnu-unique>)
target_link_options(kh_sdk_package INTERFACE
  -static-libstdc++ -static-libgcc -Wl,-z,defs
  $<BUILD_INTERFACE:-Wl,--version-script=${KH_KERNEL_COMMON_DIR}/host_library.map>
  $<INSTALL_INTERFACE:-Wl,--version-script=$<INSTALL_PREFIX>/${KH_INSTALL_CMAKE_DIR}/host_library.map>)
install(TARGETS kh_sdk_package EXPORT KernelHubTargets)
# The installed names inside the build too, so that CMake code written for the SDK also works
# in this tree.
add_library(KernelHub::package ALIAS kh_sdk_package)
add_library(KernelHub::kernel_hub ALIAS kernel_hub)
install(FILES ${KH_KERNEL_COMMON_DIR}/host_library.map DESTINATION ${KH_INSTALL_CMAKE_DIR})

# ---- CMake package files ----
install(EXPORT KernelHubTargets NAMESPACE KernelHub:: DESTINATION ${KH_INSTALL_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/KernelHubConfig.cmake.in
  ${CMAKE_BINARY_DIR}/sdk/KernelHubConfig.cmake INSTALL_DESTINATION ${KH_INSTALL_CMAKE_DIR}
  PATH_VARS KH_INSTALL_DATA_DIR)
# SameMajorVersion: the SONAME rule (kernel_hub.h "Versions") bumps MAJOR on every break.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/sdk/KernelHubConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/sdk/KernelHubConfig.cmake
              ${CMAKE_BINARY_DIR}/sdk/KernelHubConfigVersion.cmake
        DESTINATION ${KH_INSTALL_CMAKE_DIR})

# ---- pkg-config: relative to the .pc file, so a moved prefix still answers ----
file(RELATIVE_PATH KH_PC_PREFIX_FROM_PCDIR ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig
     ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" KH_PC_PREFIX_FROM_PCDIR "${KH_PC_PREFIX_FROM_PCDIR}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/kernel_hub.pc.in ${CMAKE_BINARY_DIR}/sdk/kernel_hub.pc
               @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/sdk/kernel_hub.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---- Data: the default hub and its public key ----
install(DIRECTORY ${KH_DEFAULT_HUB_DIR}/ DESTINATION ${KH_INSTALL_DATA_DIR}/default-hub)
install(FILES ${KH_DEFAULT_HUB_KEY_DIR}/signing.pub
        DESTINATION ${KH_INSTALL_DATA_DIR}/default-hub-key)

# ---- Man page and shell completion, generated from the CLI's own --help (so they stay true) ----
set(KH_CLI_DOCS ${CMAKE_BINARY_DIR}/sdk/kernel-hub.1 ${CMAKE_BINARY_DIR}/sdk/kernel-hub.bash
                ${CMAKE_BINARY_DIR}/sdk/_kernel-hub)
add_custom_command(
  OUTPUT ${KH_CLI_DOCS}
  COMMAND ${CMAKE_COMMAND} -DCLI=$<TARGET_FILE:kernel-hub> -DOUT_DIR=${CMAKE_BINARY_DIR}/sdk
          -DVERSION=${PROJECT_VERSION} -P ${CMAKE_CURRENT_LIST_DIR}/cli_docs.cmake
  DEPENDS kernel-hub ${CMAKE_CURRENT_LIST_DIR}/cli_docs.cmake
  COMMENT "Writing the kernel-hub man page and shell completion from --help")
add_custom_target(cli_docs ALL DEPENDS ${KH_CLI_DOCS})
install(FILES ${CMAKE_BINARY_DIR}/sdk/kernel-hub.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${CMAKE_BINARY_DIR}/sdk/kernel-hub.bash
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME kernel-hub)
install(FILES ${CMAKE_BINARY_DIR}/sdk/_kernel-hub
        DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/site-functions)

include(${CMAKE_CURRENT_LIST_DIR}/deb.cmake)
