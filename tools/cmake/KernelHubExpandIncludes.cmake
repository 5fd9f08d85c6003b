# cmake -DIN=<pkg>.cu -DOUT=<dir>/<pkg>.cu -DINCLUDE_DIR=<dir> -P KernelHubExpandIncludes.cmake
#
# Writes the shipped, header-free device source: every `#include "name"` line whose file exists
# beside the including file or in INCLUDE_DIR is replaced by that file's text (once per file,
# recursively), so that NVRTC compiles the result with no -I path. Any other #include is an
# error: device sources may not depend on CUDA or system headers. Written to a temp file and
# renamed (atomic).
cmake_minimum_required(VERSION 3.25)

set(kh_expanded_files "")

function(kh_expand path out_var)
  file(READ "${path}" text)
  # Include directives at the start of a line (the match keeps the newline before it).
  string(REGEX MATCHALL "\n[ \t]*#[ \t]*include[ \t]*[\"<][^\">\n]+[\">][^\n]*" incs "\n${text}")
  foreach(inc IN LISTS incs)
    string(REGEX REPLACE "^\n" "" directive "${inc}")
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">].*$" "\\1" name
                         "${directive}")
    get_filename_component(here "${path}" DIRECTORY)
    if(EXISTS "${here}/${name}")
      set(file "${here}/${name}")
    elseif(EXISTS "${INCLUDE_DIR}/${name}")
      set(file "${INCLUDE_DIR}/${name}")
    else()
      message(FATAL_ERROR "${path}: '${directive}' is neither beside it nor in ${INCLUDE_DIR}; "
                          "device sources must be header-free (no CUDA or system headers)")
    endif()
    list(FIND kh_expanded_files "${name}" seen)
    if(seen EQUAL -1)
      list(APPEND kh_expanded_files "${name}")
      set(kh_expanded_files "${kh_expanded_files}" PARENT_SCOPE)
      kh_expand("${file}" inner)
      set(kh_expanded_files "${kh_expanded_files}" PARENT_SCOPE)
      set(replacement "// ---- begin ${name} (inlined at build time) ----\n${inner}// ---- end ${name} ----")
    else()
      set(replacement "// ${name}: inlined above")
    endif()
    string(REPLACE "${directive}" "${replacement}" text "${text}")
  endforeach()
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

kh_expand("${IN}" expanded)
file(WRITE "${OUT}.tmp" "${expanded}")
file(RENAME "${OUT}.tmp" "${OUT}")
