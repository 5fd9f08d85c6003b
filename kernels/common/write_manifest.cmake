# cmake -DTEMPLATE=kernel.json.in -DOUT=<dir>/kernel.json -DDIR=<dir> -DFILES="a;b"
#       -DLAYERS_TOOL=<module_layers> -DLIBRARY=<dir>/lib<name>.so -P ...
#
# Writes the package directory's kernel.json from the package's template, with
#   @KH_LAYERS@  the layers as the host library's module table declares them (module_layers
#                loads it through the loader), so the manifest says what the loader binds;
#   @KH_FILES@   the SHA-256 of every listed file of the directory (the registry's package
#                manifest requires it; `kernel-hub pack` rewrites it when cubins are added).
# Atomic (temp + rename).
cmake_minimum_required(VERSION 3.25)

execute_process(COMMAND "${LAYERS_TOOL}" "${LIBRARY}" OUTPUT_VARIABLE KH_LAYERS
                ERROR_VARIABLE layers_error RESULT_VARIABLE layers_status)
if(NOT layers_status EQUAL 0)
  message(FATAL_ERROR "${OUT}: reading the layers of ${LIBRARY} failed (${layers_status}): "
                      "${layers_error}")
endif()

set(entries "")
foreach(f IN LISTS FILES)
  file(SHA256 "${DIR}/${f}" digest)
  list(APPEND entries "    \"${f}\": \"sha256:${digest}\"")
endforeach()
list(JOIN entries ",\n" joined)
set(KH_FILES "{\n${joined}\n  }")
file(READ "${TEMPLATE}" text)
string(REPLACE "@KH_LAYERS@" "${KH_LAYERS}" text "${text}")
string(REPLACE "@KH_FILES@" "${KH_FILES}" text "${text}")
file(WRITE "${OUT}.tmp" "${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
