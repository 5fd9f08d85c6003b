# cmake -DTEMPLATE_DIR=<init_templates> -DOUT=<init_templates.cpp> -P embed_templates.cmake
#
# Writes the files of `kernel-hub init`'s scaffold into a C++ source as raw string literals
# (tools/kernel-hub/init_templates.h), so that the installed CLI needs no data files. Names are
# relative to TEMPLATE_DIR, sorted; commands_init.cpp maps them to the scaffold's names ("NAME"
# becomes the package's short name, a leading "dot." a leading ".") and fills the @KH_...@
# placeholders. Written to a temp file and renamed (atomic).
cmake_minimum_required(VERSION 3.25)

set(delimiter "kh_init_template")
file(GLOB names RELATIVE "${TEMPLATE_DIR}" "${TEMPLATE_DIR}/*")
list(SORT names)
set(entries "")
foreach(name IN LISTS names)
  file(READ "${TEMPLATE_DIR}/${name}" text)
  string(FIND "${text}" ")${delimiter}\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${TEMPLATE_DIR}/${name} contains ')${delimiter}\"', which ends the raw "
                        "string literal it is embedded in; rephrase it")
  endif()
  string(APPEND entries "    {\"${name}\", R\"${delimiter}(${text})${delimiter}\"},\n")
endforeach()

file(WRITE "${OUT}.tmp" "// Generated from tools/kernel-hub/init_templates/ by embed_templates.cmake; do not edit.
#include \"tools/kernel-hub/init_templates.h\"

namespace kh::cli {

const std::vector<InitTemplate>& init_templates() {
  static const std::vector<InitTemplate> templates = {
${entries}  };
  return templates;
}

}  // namespace kh::cli
")
file(RENAME "${OUT}.tmp" "${OUT}")
