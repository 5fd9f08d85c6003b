#include "loader/elf_reader.h"

#include <elf.h>

#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "loader/elf_bytes.h"
#include "loader/elf_segments.h"

namespace kh::elf {

static_assert(std::endian::native == std::endian::little,
              "the ELF reader copies little-endian structs into host structs");

namespace {

using detail::DynamicSegment;
using detail::Reader;
using detail::Segments;
using detail::StringTable;

// Upper bounds that no sane shared object reaches; they bound work on hostile input.
constexpr uint64_t kMaxSections = 1u << 16;
constexpr uint64_t kMaxVersionEntries = 1u << 16;

ParseError structure(std::string message) {
  return {"elf-structure", std::move(message)};
}

ParseError disagreement(std::string message) {
  return {"dynamic-segment", std::move(message)};
}

struct Sections {
  std::vector<Elf64_Shdr> headers;

  const Elf64_Shdr* find(uint32_t type) const {
    for (auto& s : headers)
      if (s.sh_type == type) return &s;
    return nullptr;
  }
};

std::optional<ParseError> read_sections(const Reader& r, const Elf64_Ehdr& eh, Sections& out) {
  if (eh.e_shoff == 0) return structure("the file has no section headers");
  if (eh.e_shentsize != sizeof(Elf64_Shdr))
    return structure(
        fmt::format("e_shentsize is {}, expected {}", eh.e_shentsize, sizeof(Elf64_Shdr)));
  uint64_t count = eh.e_shnum;
  if (count == 0) {  // extended numbering: the real count is in section 0's sh_size
    Elf64_Shdr first;
    if (!r.read(eh.e_shoff, first)) return structure("section header 0 lies past the end");
    count = first.sh_size;
  }
  if (count == 0 || count > kMaxSections)
    return structure(fmt::format("section count {} is out of range", count));
  if (!r.fits(eh.e_shoff, count * sizeof(Elf64_Shdr)))
    return structure("the section header table lies past the end of the file");
  out.headers.resize(count);
  for (uint64_t i = 0; i < count; ++i) r.read(eh.e_shoff + i * sizeof(Elf64_Shdr), out.headers[i]);
  for (uint64_t i = 0; i < count; ++i) {
    const auto& s = out.headers[i];
    if (s.sh_type != SHT_NOBITS && s.sh_type != SHT_NULL && !r.fits(s.sh_offset, s.sh_size))
      return structure(fmt::format("section {} (offset {}, size {}) lies past the end", i,
                                   s.sh_offset, s.sh_size));
  }
  return std::nullopt;
}

// The tables the reader walks, each located where ld.so finds it (through a dynamic entry) and
// checked to be the table the section headers describe.
struct Tables {
  StringTable strings;  // DT_STRTAB / DT_STRSZ
  const Elf64_Shdr* dynsym = nullptr;
  const Elf64_Shdr* verneed = nullptr;
  const Elf64_Shdr* verdef = nullptr;
};

// A section and the dynamic entry that locates the same table must describe the same bytes: the
// section's address is the entry's, and that address loads from the section's file offset.
std::optional<ParseError> same_table(const Segments& segs, const Elf64_Shdr* sec,
                                     const char* section, std::optional<uint64_t> addr,
                                     const char* tag) {
  if (!sec && !addr) return std::nullopt;
  if (!sec)
    return disagreement(
        fmt::format("{} points at {:#x}, but there is no {} section", tag, *addr, section));
  if (!addr)
    return disagreement(
        fmt::format("there is a {} section but no {}, so ld.so never reads it", section, tag));
  if (sec->sh_addr != *addr)
    return disagreement(fmt::format("{} is {:#x}, but the {} section is at address {:#x}", tag,
                                    *addr, section, sec->sh_addr));
  auto offset = segs.file_offset(*addr, sec->sh_size);
  if (!offset || *offset != sec->sh_offset)
    return disagreement(fmt::format(
        "the {} section (file offset {:#x}, size {}) is not what ld.so loads at {} {:#x}", section,
        sec->sh_offset, sec->sh_size, tag, *addr));
  return std::nullopt;
}

std::optional<ParseError> match_sections(const Sections& secs, const Segments& segs,
                                         const DynamicSegment& dyn, Tables& out) {
  const Elf64_Shdr* dynamic = secs.find(SHT_DYNAMIC);
  const Elf64_Phdr& pt = *segs.dynamic;
  if (!dynamic) return disagreement("there is no .dynamic section to compare PT_DYNAMIC with");
  if (dynamic->sh_offset != pt.p_offset || dynamic->sh_addr != pt.p_vaddr ||
      dynamic->sh_size != pt.p_filesz)
    return disagreement(fmt::format(
        "PT_DYNAMIC (offset {:#x}, address {:#x}, size {}) and the .dynamic section (offset "
        "{:#x}, address {:#x}, size {}) disagree; ld.so reads PT_DYNAMIC",
        pt.p_offset, pt.p_vaddr, pt.p_filesz, dynamic->sh_offset, dynamic->sh_addr,
        dynamic->sh_size));

  auto strtab = dyn.value(DT_STRTAB), strsz = dyn.value(DT_STRSZ);
  if (!strtab || !strsz) return structure("the dynamic segment has no DT_STRTAB or DT_STRSZ");
  auto at = segs.file_offset(*strtab, *strsz);
  if (!at)
    return structure(fmt::format(
        "DT_STRTAB ({:#x}, {} bytes) does not lie inside a PT_LOAD segment's file image", *strtab,
        *strsz));
  out.strings = {*at, *strsz};
  // Tools that read sections (readelf, objdump) must see the strings ld.so uses.
  if (dynamic->sh_link >= secs.headers.size() ||
      secs.headers[dynamic->sh_link].sh_addr != *strtab ||
      secs.headers[dynamic->sh_link].sh_offset != *at ||
      secs.headers[dynamic->sh_link].sh_size != *strsz)
    return disagreement(
        "the .dynamic section's string table (sh_link) is not the one DT_STRTAB/DT_STRSZ names");

  out.dynsym = secs.find(SHT_DYNSYM);
  out.verneed = secs.find(SHT_GNU_verneed);
  out.verdef = secs.find(SHT_GNU_verdef);
  if (auto e = same_table(segs, out.dynsym, ".dynsym", dyn.value(DT_SYMTAB), "DT_SYMTAB")) return e;
  if (auto e = same_table(segs, secs.find(SHT_GNU_versym), ".gnu.version", dyn.value(DT_VERSYM),
                          "DT_VERSYM"))
    return e;
  if (auto e = same_table(segs, out.verneed, ".gnu.version_r", dyn.value(DT_VERNEED), "DT_VERNEED"))
    return e;
  if (auto e = same_table(segs, out.verdef, ".gnu.version_d", dyn.value(DT_VERDEF), "DT_VERDEF"))
    return e;
  if (out.verneed && dyn.value(DT_VERNEEDNUM) != uint64_t{out.verneed->sh_info})
    return disagreement("DT_VERNEEDNUM and the .gnu.version_r section's entry count disagree");
  if (out.verdef && dyn.value(DT_VERDEFNUM) != uint64_t{out.verdef->sh_info})
    return disagreement("DT_VERDEFNUM and the .gnu.version_d section's entry count disagree");
  return std::nullopt;
}

// Entry sizes ld.so assumes (glibc asserts some of them): anything else is malformed.
std::optional<ParseError> check_entry_sizes(const DynamicSegment& dyn) {
  struct Expect {
    int64_t tag;
    const char* name;
    uint64_t size;
  };
  for (auto [tag, name, size] : {Expect{DT_SYMENT, "DT_SYMENT", sizeof(Elf64_Sym)},
                                 Expect{DT_RELAENT, "DT_RELAENT", sizeof(Elf64_Rela)},
                                 Expect{DT_RELENT, "DT_RELENT", sizeof(Elf64_Rel)}})
    if (auto v = dyn.value(tag); v && *v != size)
      return structure(fmt::format("{} is {}, expected {}", name, *v, size));
  if (auto v = dyn.value(DT_PLTREL); v && *v != DT_RELA && *v != DT_REL)
    return structure(fmt::format("DT_PLTREL is {}, neither DT_REL nor DT_RELA", *v));
  return std::nullopt;
}

// The string-valued entries ld.so acts on, resolved in DT_STRTAB as ld.so resolves them.
std::optional<ParseError> read_dynamic_strings(const Reader& r, const DynamicSegment& dyn,
                                               const StringTable& str, ElfInfo& out) {
  struct Field {
    int64_t tag;
    const char* name;
    std::vector<std::string>* list;
  };
  std::vector<std::string> soname;
  for (auto [tag, name, list] :
       {Field{DT_NEEDED, "DT_NEEDED", &out.needed}, Field{DT_RPATH, "DT_RPATH", &out.rpath},
        Field{DT_RUNPATH, "DT_RUNPATH", &out.runpath}, Field{DT_SONAME, "DT_SONAME", &soname},
        Field{DT_AUXILIARY, "DT_AUXILIARY", &out.auxiliary},
        Field{DT_FILTER, "DT_FILTER", &out.filter}, Field{DT_AUDIT, "DT_AUDIT", &out.audit},
        Field{DT_DEPAUDIT, "DT_DEPAUDIT", &out.depaudit}}) {
    for (uint64_t offset : dyn.values(tag)) {
      std::string value;
      if (!r.string_in(str.offset, str.size, offset, value))
        return structure(fmt::format("{} names a string outside DT_STRTAB", name));
      list->push_back(std::move(value));
    }
  }
  if (!soname.empty()) out.soname = soname.front();
  return std::nullopt;
}

std::optional<ParseError> read_dynsym(const Reader& r, const Elf64_Shdr* sym,
                                      const StringTable& str, ElfInfo& out) {
  if (!sym) return std::nullopt;  // no dynamic symbols: the entry check reports it
  if (sym->sh_entsize != sizeof(Elf64_Sym))
    return structure(
        fmt::format(".dynsym entry size is {}, expected {}", sym->sh_entsize, sizeof(Elf64_Sym)));
  uint64_t n = sym->sh_size / sizeof(Elf64_Sym);
  for (uint64_t i = 1; i < n; ++i) {  // entry 0 is the null symbol
    Elf64_Sym s;
    r.read(sym->sh_offset + i * sizeof(Elf64_Sym), s);
    DynamicSymbol d;
    if (!r.string_in(str.offset, str.size, s.st_name, d.name))
      return structure(fmt::format("dynamic symbol {} has a name outside DT_STRTAB", i));
    d.bind = ELF64_ST_BIND(s.st_info);
    d.type = ELF64_ST_TYPE(s.st_info);
    d.visibility = ELF64_ST_VISIBILITY(s.st_other);
    d.defined = s.st_shndx != SHN_UNDEF;
    out.dynamic_symbols.push_back(std::move(d));
  }
  return std::nullopt;
}

std::optional<ParseError> read_verneed(const Reader& r, const Elf64_Shdr* sec,
                                       const StringTable& str, ElfInfo& out) {
  if (!sec) return std::nullopt;
  uint64_t off = 0, walked = 0;
  for (uint64_t i = 0; i < sec->sh_info; ++i) {
    Elf64_Verneed vn;
    if (off > sec->sh_size || sec->sh_size - off < sizeof vn || !r.read(sec->sh_offset + off, vn))
      return structure(".gnu.version_r entry lies outside its section");
    std::string file;
    if (!r.string_in(str.offset, str.size, vn.vn_file, file))
      return structure(".gnu.version_r names a file outside DT_STRTAB");
    uint64_t aux = off + vn.vn_aux;
    for (uint64_t j = 0; j < vn.vn_cnt; ++j) {
      if (++walked > kMaxVersionEntries) return structure("too many version needs");
      Elf64_Vernaux va;
      if (aux > sec->sh_size || sec->sh_size - aux < sizeof va || !r.read(sec->sh_offset + aux, va))
        return structure(".gnu.version_r auxiliary entry lies outside its section");
      VersionNeed need{file, {}};
      if (!r.string_in(str.offset, str.size, va.vna_name, need.version))
        return structure(".gnu.version_r names a version outside DT_STRTAB");
      out.version_needs.push_back(std::move(need));
      if (va.vna_next == 0) break;
      aux += va.vna_next;
    }
    if (vn.vn_next == 0) break;
    off += vn.vn_next;
  }
  return std::nullopt;
}

std::optional<ParseError> read_verdef(const Reader& r, const Elf64_Shdr* sec,
                                      const StringTable& str, ElfInfo& out) {
  if (!sec) return std::nullopt;
  uint64_t off = 0;
  for (uint64_t i = 0; i < sec->sh_info && i < kMaxVersionEntries; ++i) {
    Elf64_Verdef vd;
    if (off > sec->sh_size || sec->sh_size - off < sizeof vd || !r.read(sec->sh_offset + off, vd))
      return structure(".gnu.version_d entry lies outside its section");
    if (vd.vd_cnt > 0 && !(vd.vd_flags & VER_FLG_BASE)) {
      Elf64_Verdaux va;
      uint64_t aux = off + vd.vd_aux;
      if (aux > sec->sh_size || sec->sh_size - aux < sizeof va || !r.read(sec->sh_offset + aux, va))
        return structure(".gnu.version_d auxiliary entry lies outside its section");
      std::string name;
      if (!r.string_in(str.offset, str.size, va.vda_name, name))
        return structure(".gnu.version_d names a version outside DT_STRTAB");
      out.version_definitions.push_back(std::move(name));
    }
    if (vd.vd_next == 0) break;
    off += vd.vd_next;
  }
  return std::nullopt;
}

}  // namespace

std::string machine_name(uint16_t machine) {
  switch (machine) {
    case EM_X86_64:
      return "x86-64";
    case EM_AARCH64:
      return "AArch64";
    case EM_386:
      return "i386";
    case EM_ARM:
      return "ARM";
    case EM_PPC64:
      return "PowerPC64";
    case EM_RISCV:
      return "RISC-V";
    default:
      return fmt::format("machine {}", machine);
  }
}

std::optional<ParseError> parse_header(std::span<const uint8_t> bytes, ElfInfo& out) {
  Reader r(bytes);
  Elf64_Ehdr eh;
  if (bytes.size() < EI_NIDENT || std::memcmp(bytes.data(), ELFMAG, SELFMAG) != 0)
    return ParseError{"elf-header", "not an ELF file (bad magic)"};
  if (bytes[EI_CLASS] != ELFCLASS64)
    return ParseError{"elf-header", "not a 64-bit ELF file (ELFCLASS64 required)"};
  if (bytes[EI_DATA] != ELFDATA2LSB)
    return ParseError{"elf-header", "not a little-endian ELF file (ELFDATA2LSB required)"};
  if (!r.read(0, eh)) return ParseError{"elf-header", "the ELF header is truncated"};
  if (bytes[EI_VERSION] != EV_CURRENT || eh.e_version != EV_CURRENT)
    return ParseError{"elf-header", "unknown ELF version"};
  if (eh.e_ehsize < sizeof(Elf64_Ehdr))
    return ParseError{"elf-header", fmt::format("e_ehsize {} is too small", eh.e_ehsize)};
  out.type = eh.e_type;
  out.machine = eh.e_machine;
  return std::nullopt;
}

std::optional<ParseError> parse(std::span<const uint8_t> bytes, ElfInfo& out) {
  if (auto e = parse_header(bytes, out)) return e;
  Reader r(bytes);
  Elf64_Ehdr eh;
  r.read(0, eh);
  Segments segs;
  if (auto e = detail::read_segments(r, eh, segs)) return e;
  DynamicSegment dyn;
  if (auto e = detail::read_dynamic_segment(r, segs, dyn)) return e;
  Sections secs;
  if (auto e = read_sections(r, eh, secs)) return e;
  Tables tables;
  if (auto e = match_sections(secs, segs, dyn, tables)) return e;
  if (auto e = check_entry_sizes(dyn)) return e;
  if (auto e = read_dynamic_strings(r, dyn, tables.strings, out)) return e;
  out.textrel = dyn.value(DT_TEXTREL).has_value();
  out.flags_textrel = (dyn.value(DT_FLAGS).value_or(0) & DF_TEXTREL) != 0;
  out.has_gnu_stack = segs.gnu_stack.has_value();
  out.exec_stack = segs.gnu_stack && (segs.gnu_stack->p_flags & PF_X) != 0;
  if (auto e = read_dynsym(r, tables.dynsym, tables.strings, out)) return e;
  uint64_t symbols = tables.dynsym ? tables.dynsym->sh_size / sizeof(Elf64_Sym) : 0;
  if (auto e = detail::check_hash_tables(r, segs, dyn, symbols)) return e;
  if (auto e = read_verneed(r, tables.verneed, tables.strings, out)) return e;
  if (auto e = read_verdef(r, tables.verdef, tables.strings, out)) return e;
  return std::nullopt;
}

}  // namespace kh::elf
