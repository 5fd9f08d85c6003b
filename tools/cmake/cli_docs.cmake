cmake_minimum_required(VERSION 3.25)
# Writes kernel-hub's man page (kernel-hub.1) and its bash and zsh completion (kernel-hub.bash,
# _kernel-hub) from the CLI's own --help, the main command's and every subcommand's (one level
# of nested subcommands too), so that what is installed says what the binary does.
#   cmake -DCLI=<kernel-hub> -DOUT_DIR=<dir> -DVERSION=<x.y.z> -P cli_docs.cmake
# CLI11's help: description lines, "Usage: ...", then sections ("Positionals:", "Options:",
# "Subcommands:") of entries "  NAME   description" (a long NAME puts the description on the
# next line, indented).

# Runs `CLI <args> --help` into the variables <prefix>_DESCRIPTION, <prefix>_USAGE,
# <prefix>_<SECTION>_NAMES and _DESCS (SECTION: POSITIONALS, OPTIONS, SUBCOMMANDS). Semicolons
# and brackets are kept out of CMake's list handling as @S@, @L@, @R@ until written out.
function(read_help prefix)
  execute_process(COMMAND ${CLI} ${ARGN} --help OUTPUT_VARIABLE out RESULT_VARIABLE rc
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${CLI} ${ARGN} --help failed (${rc}): ${err}")
  endif()
  string(REPLACE ";" "@S@" out "${out}")
  string(REPLACE "[" "@L@" out "${out}")
  string(REPLACE "]" "@R@" out "${out}")
  string(REPLACE "\n" ";" lines "${out}")
  set(section DESCRIPTION)
  set(description "")
  set(usage "")
  foreach(s POSITIONALS OPTIONS SUBCOMMANDS)
    set(${s}_names "")
    set(${s}_descs "")
  endforeach()
  foreach(line IN LISTS lines)
    if(line MATCHES "^Usage: (.*)$")
      set(usage "${CMAKE_MATCH_1}")
      set(section NONE)
    elseif(line STREQUAL "Positionals:")
      set(section POSITIONALS)
    elseif(line STREQUAL "Options:")
      set(section OPTIONS)
    elseif(line STREQUAL "Subcommands:")
      set(section SUBCOMMANDS)
    elseif(section STREQUAL "DESCRIPTION")
      if(NOT line STREQUAL "")
        string(APPEND description "${line}\n")
      endif()
    elseif(section MATCHES "POSITIONALS|OPTIONS|SUBCOMMANDS")
      if(line MATCHES "^  ([^ ].*[^ ])   +(.*)$")
        list(APPEND ${section}_names "${CMAKE_MATCH_1}")
        list(APPEND ${section}_descs "${CMAKE_MATCH_2}")
      elseif(line MATCHES "^  ([^ ].*)$")
        list(APPEND ${section}_names "${CMAKE_MATCH_1}")
        list(APPEND ${section}_descs "")
      elseif(line MATCHES "^   +([^ ].*)$")
        # The description of a long NAME, on its own line.
        list(POP_BACK ${section}_descs last)
        list(APPEND ${section}_descs "${last}${CMAKE_MATCH_1}")
      endif()
    endif()
  endforeach()
  set(${prefix}_DESCRIPTION "${description}" PARENT_SCOPE)
  set(${prefix}_USAGE "${usage}" PARENT_SCOPE)
  foreach(s POSITIONALS OPTIONS SUBCOMMANDS)
    set(${prefix}_${s}_NAMES "${${s}_names}" PARENT_SCOPE)
    set(${prefix}_${s}_DESCS "${${s}_descs}" PARENT_SCOPE)
  endforeach()
endfunction()

# roff text: backslashes escaped, no line starting with a control character, brackets back.
function(roff out text)
  string(REPLACE "\\" "\\e" text "${text}")
  string(REPLACE "-" "\\-" text "${text}")
  string(REPLACE "\n." "\n\\&." text "${text}")
  string(REPLACE "\n'" "\n\\&'" text "${text}")
  if(text MATCHES "^[.']")
    set(text "\\&${text}")
  endif()
  unescape(text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

function(unescape out text)
  string(REPLACE "@S@" ";" text "${text}")
  string(REPLACE "@L@" "[" text "${text}")
  string(REPLACE "@R@" "]" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# The option words of an entry name: "-h,--help" -> "-h;--help"; "--steps INT:INT in ..." ->
# "--steps"; positionals give none.
function(option_words out name)
  string(REGEX REPLACE " .*$" "" first "${name}")
  string(REPLACE "," ";" words "${first}")
  list(FILTER words INCLUDE REGEX "^-")
  set(${out} "${words}" PARENT_SCOPE)
endfunction()

# Man page entries (.TP) for one help section.
function(man_entries out names descs)
  set(text "")
  foreach(name desc IN ZIP_LISTS names descs)
    roff(name_roff "${name}")
    roff(desc_roff "${desc}")
    string(APPEND text ".TP\n\\fB${name_roff}\\fR\n${desc_roff}\n")
  endforeach()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# ---- Read every help ----
read_help(MAIN)
set(commands "")  # "pull", "trust add", ...
foreach(sub IN LISTS MAIN_SUBCOMMANDS_NAMES)
  list(APPEND commands "${sub}")
  string(MAKE_C_IDENTIFIER "${sub}" id)
  read_help(CMD_${id} ${sub})
  foreach(nested IN LISTS CMD_${id}_SUBCOMMANDS_NAMES)
    list(APPEND commands "${sub} ${nested}")
    string(MAKE_C_IDENTIFIER "${sub} ${nested}" nid)
    read_help(CMD_${nid} ${sub} ${nested})
  endforeach()
endforeach()

# ---- Man page ----
string(REGEX REPLACE "\n.*" "" summary "${MAIN_DESCRIPTION}")
string(REGEX REPLACE "^kernel-hub: *" "" summary "${summary}")
string(REGEX REPLACE "\\.$" "" summary "${summary}")
roff(summary "${summary}")
roff(description "${MAIN_DESCRIPTION}")
set(man ".\\\" Generated from `kernel-hub --help` by tools/cmake/cli_docs.cmake; do not edit.\n")
string(APPEND man ".TH KERNEL-HUB 1 \"\" \"kernel-hub ${VERSION}\" \"User Commands\"\n")
string(APPEND man ".SH NAME\nkernel\\-hub \\- ${summary}\n")
string(APPEND man ".SH SYNOPSIS\n.B kernel\\-hub\n[\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]\n")
string(APPEND man ".SH DESCRIPTION\n${description}")
string(APPEND man ".PP\nEvery command takes \\fB\\-\\-help\\fR. The embedded default hub and its public key "
                  "are read from \\fIPREFIX\\fR/share/kernel\\-hub, found relative to the binary "
                  "(so an installed prefix may be moved), or from \\fB$KERNEL_HUB_DATA_DIR\\fR.\n")
man_entries(options "${MAIN_OPTIONS_NAMES}" "${MAIN_OPTIONS_DESCS}")
string(APPEND man ".SH OPTIONS\n${options}")
string(APPEND man ".SH COMMANDS\n")
foreach(command IN LISTS commands)
  string(MAKE_C_IDENTIFIER "${command}" id)
  roff(title "kernel-hub ${command}")
  roff(desc "${CMD_${id}_DESCRIPTION}")
  roff(usage "${CMD_${id}_USAGE}")
  string(APPEND man ".SS \"${title}\"\n${desc}.PP\nUsage: ${usage}\n")
  man_entries(entries "${CMD_${id}_POSITIONALS_NAMES}" "${CMD_${id}_POSITIONALS_DESCS}")
  string(APPEND man "${entries}")
  man_entries(entries "${CMD_${id}_OPTIONS_NAMES}" "${CMD_${id}_OPTIONS_DESCS}")
  string(APPEND man "${entries}")
  man_entries(entries "${CMD_${id}_SUBCOMMANDS_NAMES}" "${CMD_${id}_SUBCOMMANDS_DESCS}")
  string(APPEND man "${entries}")
endforeach()
string(APPEND man ".SH FILES\n.TP\n\\fIPREFIX\\fR/share/kernel\\-hub/default\\-hub\n"
                  "The embedded default hub (a signed OCI layout hub).\n"
                  ".TP\n\\fIPREFIX\\fR/share/kernel\\-hub/default\\-hub\\-key/signing.pub\n"
                  "Its public key, trusted for kernel\\-hub/*.\n")
string(APPEND man ".SH SEE ALSO\nThe README of kernel\\-hub; the C and C++ APIs in "
                  "\\fIPREFIX\\fR/include/kernel_hub/.\n")
file(WRITE ${OUT_DIR}/kernel-hub.1 "${man}")

# ---- Completion: the words each command takes ----
set(value_options "")  # global options that take a value (skipped when finding the command)
set(main_opts "")
foreach(name IN LISTS MAIN_OPTIONS_NAMES)
  option_words(words "${name}")
  if(name MATCHES " ")
    list(APPEND value_options ${words})
  endif()
  list(APPEND main_opts ${words})
endforeach()
list(JOIN main_opts " " main_opts)
list(JOIN MAIN_SUBCOMMANDS_NAMES " " main_subs)
list(JOIN value_options "|" value_options)

set(bash_cases "")
set(zsh_cases "")
set(zsh_commands "")
foreach(command IN LISTS commands)
  string(MAKE_C_IDENTIFIER "${command}" id)
  set(opts "")
  foreach(name IN LISTS CMD_${id}_OPTIONS_NAMES)
    option_words(w "${name}")
    list(APPEND opts ${w})
  endforeach()
  list(JOIN opts " " opts)
  list(JOIN CMD_${id}_SUBCOMMANDS_NAMES " " subs)
  string(APPEND bash_cases "    \"${command}\") opts=\"${opts}\" subs=\"${subs}\" ;;\n")
  string(APPEND zsh_cases "    \"${command}\") opts=(${opts}) subs=(${subs}) ;;\n")
endforeach()
foreach(sub desc IN ZIP_LISTS MAIN_SUBCOMMANDS_NAMES MAIN_SUBCOMMANDS_DESCS)
  # The first sentence, without the characters zsh's _describe or the quoting would read.
  string(REGEX REPLACE "(@S@|@L@|[.:(]).*$" "" desc "${desc}")
  string(REGEX REPLACE "['\\\\$`]" "" desc "${desc}")
  string(STRIP "${desc}" desc)
  string(APPEND zsh_commands "    '${sub}:${desc}'\n")
endforeach()
# Nested commands are found by their first two words.
set(bash [=[
# bash completion for kernel-hub. Generated from `kernel-hub --help` by tools/cmake/cli_docs.cmake.
_kernel_hub() {
  local cur=${COMP_WORDS[COMP_CWORD]} command="" i skip=0
  for ((i = 1; i < COMP_CWORD; i++)); do
    local w=${COMP_WORDS[i]}
    if ((skip)); then skip=0; continue; fi
    case $w in
      @VALUE_OPTIONS@) [[ -z $command ]] && skip=1 ;;
      -*) ;;
      *) if [[ -z $command ]]; then command=$w; else
           case "$command $w" in @NESTED@) command="$command $w" ;; esac
           break
         fi ;;
    esac
  done
  local opts subs
  case $command in
    "") opts="@MAIN_OPTS@" subs="@MAIN_SUBS@" ;;
@CASES@    *) opts="" subs="" ;;
  esac
  # Options after a dash, else the command's subcommands; else bash's default (file names).
  if [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")
  elif [[ -n $subs ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$subs" -- "$cur")
  fi
}
complete -o default -o bashdefault -F _kernel_hub kernel-hub
]=])
set(nested "")
foreach(command IN LISTS commands)
  if(command MATCHES " ")
    list(APPEND nested "\"${command}\"")
  endif()
endforeach()
list(JOIN nested "|" nested)
if(nested STREQUAL "")
  set(nested "\"\"")
endif()
string(REPLACE "@VALUE_OPTIONS@" "${value_options}" bash "${bash}")
string(REPLACE "@NESTED@" "${nested}" bash "${bash}")
string(REPLACE "@MAIN_OPTS@" "${main_opts}" bash "${bash}")
string(REPLACE "@MAIN_SUBS@" "${main_subs}" bash "${bash}")
string(REPLACE "@CASES@" "${bash_cases}" bash "${bash}")
unescape(bash "${bash}")
file(WRITE ${OUT_DIR}/kernel-hub.bash "${bash}")

set(zsh [=[
#compdef kernel-hub
# zsh completion for kernel-hub. Generated from `kernel-hub --help` by tools/cmake/cli_docs.cmake.
_kernel-hub() {
  local -a commands
  commands=(
@COMMANDS@  )
  local command="" i skip=0
  for ((i = 2; i < CURRENT; i++)); do
    if ((skip)); then skip=0; continue; fi
    case ${words[i]} in
      @VALUE_OPTIONS@) [[ -z $command ]] && skip=1 ;;
      -*) ;;
      *) if [[ -z $command ]]; then command=${words[i]}; else
           case "$command ${words[i]}" in @NESTED@) command="$command ${words[i]}" ;; esac
           break
         fi ;;
    esac
  done
  local -a opts subs
  case $command in
    "") opts=(@MAIN_OPTS@) ;;
@CASES@  esac
  if [[ $PREFIX == -* ]]; then
    compadd -- $opts
  elif [[ -z $command ]]; then
    _describe -t commands 'kernel-hub command' commands
  elif (( ${#subs} )); then
    compadd -- $subs
  else
    _files
  fi
}
_kernel-hub "$@"
]=])
string(REPLACE "@COMMANDS@" "${zsh_commands}" zsh "${zsh}")
string(REPLACE "@VALUE_OPTIONS@" "${value_options}" zsh "${zsh}")
string(REPLACE "@NESTED@" "${nested}" zsh "${zsh}")
string(REPLACE "@MAIN_OPTS@" "${main_opts}" zsh "${zsh}")
string(REPLACE "@CASES@" "${zsh_cases}" zsh "${zsh}")
unescape(zsh "${zsh}")
file(WRITE ${OUT_DIR}/_kernel-hub "${zsh}")
