#include "loader/elf_segments.h"

#include <set>
#include <string>

#include <fmt/format.h>

namespace kh::elf::detail {

namespace {

// Upper bounds that no sane shared object reaches; they bound work on hostile input.
constexpr uint64_t kMaxSegments = 1024;
constexpr uint64_t kMaxDynamicEntries = 1u << 16;
constexpr uint64_t kMaxHashBuckets = 1u << 24;

ParseError structure(std::string message) {
  return {"elf-structure", std::move(message)};
}

ParseError disagreement(std::string message) {
  return {"dynamic-segment", std::move(message)};
}

// Tags ld.so keeps one value of (the last one wins there): a second copy is refused, so that the
// preflight and ld.so cannot read different values.
bool single_valued(int64_t tag) {
  switch (tag) {
    case DT_STRTAB:
    case DT_STRSZ:
    case DT_SYMTAB:
    case DT_SYMENT:
    case DT_HASH:
    case DT_GNU_HASH:
    case DT_SONAME:
    case DT_FLAGS:
    case DT_FLAGS_1:
    case DT_VERSYM:
    case DT_VERNEED:
    case DT_VERNEEDNUM:
    case DT_VERDEF:
    case DT_VERDEFNUM:
    case DT_RELA:
    case DT_RELASZ:
    case DT_RELAENT:
    case DT_REL:
    case DT_RELSZ:
    case DT_RELENT:
    case DT_JMPREL:
    case DT_PLTREL:
    case DT_PLTRELSZ:
    case DT_INIT:
    case DT_FINI:
    case DT_INIT_ARRAY:
    case DT_INIT_ARRAYSZ:
    case DT_FINI_ARRAY:
    case DT_FINI_ARRAYSZ:
      return true;
    default:
      return false;
  }
}

uint32_t read_u32(const Reader& r, uint64_t offset) {
  uint32_t v = 0;
  r.read(offset, v);  // callers checked the range
  return v;
}

std::optional<ParseError> check_sysv_hash(const Reader& r, const Segments& segs, uint64_t addr,
                                          uint64_t symbol_count) {
  auto ext = segs.file_extent(addr);
  if (!ext || ext->second < 8)
    return structure("DT_HASH does not lie inside a PT_LOAD segment's file image");
  uint32_t nbucket = read_u32(r, ext->first), nchain = read_u32(r, ext->first + 4);
  if (nbucket == 0 || nbucket > kMaxHashBuckets)
    return structure(
        fmt::format("DT_HASH has {} buckets (1 to {} expected)", nbucket, kMaxHashBuckets));
  uint64_t words = 2 + uint64_t{nbucket} + nchain;
  if (words > ext->second / 4)
    return structure("DT_HASH's buckets and chains run past its segment's file image");
  if (nchain != symbol_count)
    return disagreement(fmt::format(
        "DT_HASH covers {} symbols but .dynsym holds {}: ld.so would look up symbols the "
        "preflight never read",
        nchain, symbol_count));
  for (uint64_t i = 2; i < words; ++i)
    if (read_u32(r, ext->first + 4 * i) >= nchain)
      return structure(
          fmt::format("DT_HASH entry {} names a symbol past the {} it covers", i - 2, nchain));
  return std::nullopt;
}

std::optional<ParseError> check_gnu_hash(const Reader& r, const Segments& segs, uint64_t addr,
                                         uint64_t symbol_count) {
  auto ext = segs.file_extent(addr);
  if (!ext || ext->second < 16)
    return structure("DT_GNU_HASH does not lie inside a PT_LOAD segment's file image");
  const uint64_t base = ext->first;
  uint32_t nbuckets = read_u32(r, base), symoffset = read_u32(r, base + 4),
           bloom_size = read_u32(r, base + 8);
  if (nbuckets == 0 || nbuckets > kMaxHashBuckets)
    return structure(
        fmt::format("DT_GNU_HASH has {} buckets (1 to {} expected)", nbuckets, kMaxHashBuckets));
  if (bloom_size == 0 || (bloom_size & (bloom_size - 1)) != 0)
    return structure(
        fmt::format("DT_GNU_HASH's Bloom filter has {} words, not a power of two", bloom_size));
  if (symoffset > symbol_count)
    return disagreement(fmt::format("DT_GNU_HASH starts at symbol {} but .dynsym holds {}",
                                    symoffset, symbol_count));
  // Layout in 32-bit words: 4 header words, the Bloom filter (64-bit words), the buckets, then
  // one chain word per hashed symbol.
  const uint64_t buckets_at = 4 + 2 * uint64_t{bloom_size};
  const uint64_t chain_at = buckets_at + nbuckets;
  const uint64_t chain_length = symbol_count - symoffset;
  if (chain_at + chain_length > ext->second / 4)
    return structure("DT_GNU_HASH's buckets and chains run past its segment's file image");
  // ends[i]: walking the chain from symbol symoffset + i reaches an end marker (low bit set)
  // before it leaves .dynsym.
  std::vector<bool> ends(chain_length + 1, false);
  for (uint64_t i = chain_length; i-- > 0;)
    ends[i] = (read_u32(r, base + 4 * (chain_at + i)) & 1) != 0 || ends[i + 1];
  for (uint64_t b = 0; b < nbuckets; ++b) {
    uint32_t first = read_u32(r, base + 4 * (buckets_at + b));
    if (first == 0) continue;
    if (first < symoffset || first >= symbol_count || !ends[first - symoffset])
      return disagreement(
          fmt::format("DT_GNU_HASH bucket {} leads ld.so to symbols outside the {} in .dynsym", b,
                      symbol_count));
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::pair<uint64_t, uint64_t>> Segments::file_extent(uint64_t vaddr) const {
  for (const auto& l : loads) {
    if (vaddr < l.p_vaddr || vaddr - l.p_vaddr >= l.p_filesz) continue;
    uint64_t delta = vaddr - l.p_vaddr;
    return std::pair{l.p_offset + delta, l.p_filesz - delta};
  }
  return std::nullopt;
}

std::optional<uint64_t> Segments::file_offset(uint64_t vaddr, uint64_t size) const {
  auto ext = file_extent(vaddr);
  if (!ext || size > ext->second) return std::nullopt;
  return ext->first;
}

std::optional<ParseError> read_segments(const Reader& r, const Elf64_Ehdr& eh, Segments& out) {
  if (eh.e_phoff == 0 || eh.e_phnum == 0)
    return structure("the file has no program headers, so ld.so cannot load it");
  if (eh.e_phentsize != sizeof(Elf64_Phdr))
    return structure(
        fmt::format("e_phentsize is {}, expected {}", eh.e_phentsize, sizeof(Elf64_Phdr)));
  if (eh.e_phnum == PN_XNUM || eh.e_phnum > kMaxSegments)
    return structure(fmt::format("program header count {} is out of range (at most {})", eh.e_phnum,
                                 kMaxSegments));
  if (!r.fits(eh.e_phoff, uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr)))
    return structure("the program header table lies past the end of the file");
  for (uint64_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr p;
    r.read(eh.e_phoff + i * sizeof p, p);
    if (p.p_type == PT_LOAD) {
      if (p.p_filesz > p.p_memsz)
        return structure(fmt::format("PT_LOAD {} has a file size ({}) above its memory size ({})",
                                     i, p.p_filesz, p.p_memsz));
      if (!r.fits(p.p_offset, p.p_filesz))
        return structure(
            fmt::format("PT_LOAD {} (offset {}, size {}) lies past the end of the file", i,
                        p.p_offset, p.p_filesz));
      if (p.p_memsz > UINT64_MAX - p.p_vaddr)
        return structure(fmt::format("PT_LOAD {} wraps around the address space", i));
      if (!out.loads.empty() && p.p_vaddr < out.loads.back().p_vaddr + out.loads.back().p_memsz)
        return structure(fmt::format(
            "PT_LOAD {} (address {:#x}) overlaps or precedes the segment before it; ld.so maps "
            "them in address order",
            i, p.p_vaddr));
      out.loads.push_back(p);
    } else if (p.p_type == PT_DYNAMIC) {
      if (out.dynamic) return disagreement("there are two PT_DYNAMIC program headers");
      out.dynamic = p;
    } else if (p.p_type == PT_GNU_STACK) {
      if (out.gnu_stack) return structure("there are two PT_GNU_STACK program headers");
      out.gnu_stack = p;
    }
  }
  if (out.loads.empty()) return structure("there is no PT_LOAD segment: ld.so would map nothing");
  return std::nullopt;
}

std::optional<uint64_t> DynamicSegment::value(int64_t tag) const {
  for (const auto& e : entries)
    if (e.d_tag == tag) return e.d_un.d_val;
  return std::nullopt;
}

std::vector<uint64_t> DynamicSegment::values(int64_t tag) const {
  std::vector<uint64_t> out;
  for (const auto& e : entries)
    if (e.d_tag == tag) out.push_back(e.d_un.d_val);
  return out;
}

std::optional<ParseError> read_dynamic_segment(const Reader& r, const Segments& segs,
                                               DynamicSegment& out) {
  if (!segs.dynamic)
    return disagreement(
        "there is no PT_DYNAMIC program header; ld.so finds the dynamic entries only through it");
  const Elf64_Phdr& d = *segs.dynamic;
  auto at = segs.file_offset(d.p_vaddr, d.p_filesz);
  if (!at || d.p_filesz < sizeof(Elf64_Dyn))
    return disagreement(fmt::format(
        "PT_DYNAMIC (address {:#x}, size {}) does not lie inside a PT_LOAD segment's file image",
        d.p_vaddr, d.p_filesz));
  if (*at != d.p_offset)
    return disagreement(fmt::format(
        "PT_DYNAMIC says file offset {:#x}, but its address {:#x} is loaded from file offset "
        "{:#x}, which is what ld.so reads",
        d.p_offset, d.p_vaddr, *at));
  out.file_offset = *at;
  const uint64_t n = std::min<uint64_t>(d.p_filesz / sizeof(Elf64_Dyn), kMaxDynamicEntries);
  std::set<int64_t> seen;
  for (uint64_t i = 0; i < n; ++i) {
    Elf64_Dyn e;
    r.read(*at + i * sizeof e, e);  // inside the PT_LOAD's file image, checked above
    if (e.d_tag == DT_NULL) return std::nullopt;
    if (single_valued(e.d_tag) && !seen.insert(e.d_tag).second)
      return disagreement(fmt::format(
          "dynamic tag {:#x} appears twice; ld.so would use one copy and the preflight the other",
          e.d_tag));
    out.entries.push_back(e);
  }
  return disagreement(
      "the dynamic segment has no DT_NULL entry inside PT_DYNAMIC; ld.so would read past it");
}

std::optional<ParseError> check_hash_tables(const Reader& r, const Segments& segs,
                                            const DynamicSegment& dyn, uint64_t symbol_count) {
  if (auto addr = dyn.value(DT_HASH))
    if (auto e = check_sysv_hash(r, segs, *addr, symbol_count)) return e;
  if (auto addr = dyn.value(DT_GNU_HASH))
    if (auto e = check_gnu_hash(r, segs, *addr, symbol_count)) return e;
  return std::nullopt;
}

}  // namespace kh::elf::detail
