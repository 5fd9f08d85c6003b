// What ld.so reads of a shared object: the program headers (PT_LOAD, PT_DYNAMIC, PT_GNU_STACK),
// the dynamic segment's entries and the hash tables it looks symbol names up in. ld.so never
// reads section headers, so the preflight reads these too: an address in the dynamic segment is
// mapped to a file offset through the PT_LOAD segments, as the loader maps the file into memory.
// Internal to loader/elf_*.cpp.
#pragma once

#include <elf.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "loader/elf_bytes.h"
#include "loader/elf_reader.h"

namespace kh::elf::detail {

struct Segments {
  std::vector<Elf64_Phdr> loads;        // PT_LOAD, sorted by address, not overlapping
  std::optional<Elf64_Phdr> dynamic;    // PT_DYNAMIC
  std::optional<Elf64_Phdr> gnu_stack;  // PT_GNU_STACK

  // The file offset of the `size` bytes loaded at `vaddr`, when one PT_LOAD's file image holds
  // them all (bytes past p_filesz are zero-filled memory, not file contents).
  std::optional<uint64_t> file_offset(uint64_t vaddr, uint64_t size) const;
  // The file offset of `vaddr` and how many bytes of its PT_LOAD's file image start there.
  std::optional<std::pair<uint64_t, uint64_t>> file_extent(uint64_t vaddr) const;
};

// Reads and checks the program header table: entry size, count, every PT_LOAD inside the file,
// in address order and not overlapping; at most one PT_DYNAMIC and one PT_GNU_STACK.
std::optional<ParseError> read_segments(const Reader& r, const Elf64_Ehdr& eh, Segments& out);

// The dynamic segment's entries up to DT_NULL, read where ld.so reads them: at PT_DYNAMIC's
// address, mapped through the PT_LOAD segments.
struct DynamicSegment {
  uint64_t file_offset = 0;
  std::vector<Elf64_Dyn> entries;  // up to, not including, DT_NULL

  // The value of a tag that may appear only once (reading refuses duplicates); nullopt if absent.
  std::optional<uint64_t> value(int64_t tag) const;
  // Every value of a tag, in order (DT_NEEDED, DT_FILTER, ...).
  std::vector<uint64_t> values(int64_t tag) const;
};

std::optional<ParseError> read_dynamic_segment(const Reader& r, const Segments& segs,
                                               DynamicSegment& out);

// Checks that every symbol index ld.so can reach through DT_HASH or DT_GNU_HASH is below
// `symbol_count` (the symbols the preflight read), and that the tables cannot make ld.so divide
// by zero or index out of bounds.
std::optional<ParseError> check_hash_tables(const Reader& r, const Segments& segs,
                                            const DynamicSegment& dyn, uint64_t symbol_count);

}  // namespace kh::elf::detail
