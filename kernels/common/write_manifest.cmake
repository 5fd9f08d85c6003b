# cmake -DTEMPLATE=kernel.json.in -DOUT=<dir>/kernel.json -DDIR=<dir> -DFILES="a;b" -P ...
#
# Writes the package directory's kernel.json from the package's template, with "files" filled
# in: the SHA-256 of every listed file of the directory (the registry's package manifest
# requires it; `kernel-hub pack` rewrites it when cubins are added). Atomic (temp + rename).
cmake_minimum_required(VERSION 3.25)

set(entries "")
foreach(f IN LISTS FILES)
  file(SHA256 "${DIR}/${f}" digest)
  list(APPEND entries "    \"${f}\": \"sha256:${digest}\"")
endforeach()
list(JOIN entries ",\n" joined)
set(KH_FILES "{\n${joined}\n  }")
file(READ "${TEMPLATE}" text)
string(REPLACE "@KH_FILES@" "${KH_FILES}" text "${text}")
file(WRITE "${OUT}.tmp" "${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
