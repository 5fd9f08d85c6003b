# cmake -DIN=<source> -DOUT=<file.cpp> -DFUNCTION=<name> -P embed_source.cmake
#
# Writes a C++ file defining `const char* kh::demo::FUNCTION()` that returns IN's text (a raw
# string literal), so that the demo carries its device source in the binary and compiles it at
# run time through the device API. Written to a temp file and renamed (atomic).
cmake_minimum_required(VERSION 3.25)
file(READ "${IN}" text)
string(FIND "${text}" ")khsrc\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw string delimiter )khsrc\"")
endif()
file(WRITE "${OUT}.tmp" "// Generated from ${IN} by tools/demo/embed_source.cmake: do not edit.
namespace kh::demo {
const char* ${FUNCTION}() {
  return R\"khsrc(${text})khsrc\";
}
}  // namespace kh::demo
")
file(RENAME "${OUT}.tmp" "${OUT}")
