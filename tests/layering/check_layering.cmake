# Keeps the layering of DESIGN.md "Folders": the loader builds on the hub's utilities only, and
# the public headers stand alone. Fails, listing every offending line, when
#   - a file under loader/ includes "registry/..." or "hub/..." other than "hub/base/...";
#   - a public header (include/kernel_hub/) includes anything but "kernel_hub/..." and system
#     headers (<...>).
#   cmake -DSOURCE_DIR=<repository root> -P check_layering.cmake
if(NOT IS_DIRECTORY "${SOURCE_DIR}/loader")
  message(FATAL_ERROR "usage: cmake -DSOURCE_DIR=<repository root> -P check_layering.cmake")
endif()

set(problems "")

# Every #include line of the C and C++ files under `dir` whose target matches `regex`, unless it
# also matches `allowed`; appends "file: line" to `problems`.
function(check_includes dir regex allowed why)
  file(GLOB_RECURSE files LIST_DIRECTORIES false "${SOURCE_DIR}/${dir}/*.h"
       "${SOURCE_DIR}/${dir}/*.hpp" "${SOURCE_DIR}/${dir}/*.c" "${SOURCE_DIR}/${dir}/*.cpp")
  if(NOT files)
    message(FATAL_ERROR "no C or C++ files under ${SOURCE_DIR}/${dir}: nothing to check")
  endif()
  list(LENGTH files count)
  message(STATUS "${dir}/: ${count} files")
  foreach(f IN LISTS files)
    file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*${regex}")
    foreach(line IN LISTS lines)
      if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*${allowed}")
        file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
        string(STRIP "${line}" line)
        string(APPEND problems "  ${rel}: ${line}  (${why})\n")
      endif()
    endforeach()
  endforeach()
  set(problems "${problems}" PARENT_SCOPE)
endfunction()

check_includes(loader "[<\"](registry|hub)/" "[<\"]hub/base/"
               "the loader may use hub/base only")
check_includes(include/kernel_hub "\"" "\"kernel_hub/"
               "a public header may include only kernel_hub/* and system headers")

if(problems)
  message(FATAL_ERROR "layering broken:\n${problems}")
endif()
message(STATUS "layering kept: loader/ uses hub/base only; the public headers stand alone")
