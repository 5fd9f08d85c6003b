// A small, bounds-checked reader of 64-bit little-endian ELF shared objects. It parses untrusted
// bytes (package host libraries before any dlopen), so every offset, size and count is checked
// against the buffer and every chain walk is bounded; malformed input yields an error, never a
// read outside the span.
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
  std::vector<DynamicSymbol> dynamic_symbols;
  std::vector<VersionNeed> version_needs;
  std::vector<std::string> version_definitions;  // .gnu.version_d names, base entry excluded
};

// What went wrong while parsing, for the preflight's messages.
struct ParseError {
  std::string rule;     // "elf-header" or "elf-structure"
  std::string message;  // what is malformed
};

// Parses the header only: ELF magic, ELFCLASS64, ELFDATA2LSB, version, e_type, e_machine.
// Fills type and machine. Returns an error for anything that is not a 64-bit LE ELF file.
std::optional<ParseError> parse_header(std::span<const uint8_t> bytes, ElfInfo& out);

// Parses header, section table, dynamic section, dynamic symbols and symbol versions.
std::optional<ParseError> parse(std::span<const uint8_t> bytes, ElfInfo& out);

// Name of an e_machine value ("x86-64", "AArch64", or "machine 40").
std::string machine_name(uint16_t machine);

}  // namespace kh::elf
