// A small, bounds-checked reader of 64-bit little-endian ELF shared objects. It parses untrusted
// bytes (package host libraries before any dlopen), so every offset, size and count is checked
// against the buffer and every chain walk is bounded; malformed input yields an error, never a
// read outside the span. It reads what ld.so reads: the program headers and the dynamic segment
// at PT_DYNAMIC's address (not the section headers, which ld.so ignores); the tables it also
// reads through section headers (.dynsym, .gnu.version_r/_d) must be the ones the dynamic
// entries point at, or the file is refused.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace kh::elf {

struct DynamicSymbol {
  std::string name;
  unsigned char bind = 0;        // STB_*
  unsigned char type = 0;        // STT_*
  unsigned char visibility = 0;  // STV_*
  bool defined = false;          // st_shndx != SHN_UNDEF
};

// One (file, version) need from .gnu.version_r, e.g. {"libc.so.6", "GLIBC_2.34"}.
struct VersionNeed {
  std::string file;
  std::string version;
};

struct ElfInfo {
  uint16_t type = 0;     // e_type
  uint16_t machine = 0;  // e_machine
  std::vector<std::string> needed;
  std::vector<std::string> rpath;    // DT_RPATH values
  std::vector<std::string> runpath;  // DT_RUNPATH values
  std::string soname;
  std::vector<std::string> auxiliary;  // DT_AUXILIARY values
  std::vector<std::string> filter;     // DT_FILTER values
  std::vector<std::string> audit;      // DT_AUDIT values
  std::vector<std::string> depaudit;   // DT_DEPAUDIT values
  bool textrel = false;                // DT_TEXTREL present
  bool flags_textrel = false;          // DF_TEXTREL set in DT_FLAGS
  bool has_gnu_stack = false;          // a PT_GNU_STACK program header exists
  bool exec_stack = false;             // PT_GNU_STACK has PF_X
  std::vector<DynamicSymbol> dynamic_symbols;
  std::vector<VersionNeed> version_needs;
  std::vector<std::string> version_definitions;  // .gnu.version_d names, base entry excluded
};

// What went wrong while parsing, for the preflight's messages.
struct ParseError {
  std::string rule;     // "elf-header", "elf-structure" or "dynamic-segment"
  std::string message;  // what is malformed
};

// Parses the header only: ELF magic, ELFCLASS64, ELFDATA2LSB, version, e_type, e_machine.
// Fills type and machine. Returns an error for anything that is not a 64-bit LE ELF file.
std::optional<ParseError> parse_header(std::span<const uint8_t> bytes, ElfInfo& out);

// Parses header, program headers, the dynamic segment, section table, dynamic symbols and symbol
// versions. "dynamic-segment" errors mean that ld.so would read something other than what the
// section headers describe (PT_DYNAMIC vs .dynamic, DT_SYMTAB vs .dynsym, hash tables reaching
// past .dynsym, ...).
std::optional<ParseError> parse(std::span<const uint8_t> bytes, ElfInfo& out);

// Name of an e_machine value ("x86-64", "AArch64", or "machine 40").
std::string machine_name(uint16_t machine);

}  // namespace kh::elf
