#include "loader/elf_reader.h"

#include <elf.h>

#include <bit>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>

namespace kh::elf {

static_assert(std::endian::native == std::endian::little,
              "the ELF reader copies little-endian structs into host structs");

namespace {

// Upper bounds that no sane shared object reaches; they bound work on hostile input.
constexpr uint64_t kMaxSections = 1u << 16;
constexpr uint64_t kMaxVersionEntries = 1u << 16;
constexpr uint64_t kMaxStringLength = 1u << 16;

// A checked view of the input: every read names what it reads for the error message.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  bool fits(uint64_t offset, uint64_t size) const {
    return offset <= bytes_.size() && size <= bytes_.size() - offset;
  }

  template <typename T>
  bool read(uint64_t offset, T& out) const {
    static_assert(std::is_trivially_copyable_v<T>);
    if (!fits(offset, sizeof(T))) return false;
    std::memcpy(&out, bytes_.data() + offset, sizeof(T));
    return true;
  }

  // A NUL-terminated string at `offset` inside [begin, begin + size).
  bool string_in(uint64_t begin, uint64_t size, uint64_t offset, std::string& out) const {
    if (!fits(begin, size) || offset >= size) return false;
    const uint8_t* start = bytes_.data() + begin + offset;
    uint64_t room = std::min<uint64_t>(size - offset, kMaxStringLength);
    const void* nul = std::memchr(start, 0, room);
    if (!nul) return false;
    out.assign(reinterpret_cast<const char*>(start), static_cast<const uint8_t*>(nul) - start);
    return true;
  }

  uint64_t size() const { return bytes_.size(); }

 private:
  std::span<const uint8_t> bytes_;
};

ParseError structure(std::string message) {
  return {"elf-structure", std::move(message)};
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

// The string table a section links to (sh_link), checked to be SHT_STRTAB.
std::optional<ParseError> linked_strtab(const Sections& secs, const Elf64_Shdr& s, const char* what,
                                        const Elf64_Shdr*& out) {
  if (s.sh_link >= secs.headers.size() || secs.headers[s.sh_link].sh_type != SHT_STRTAB)
    return structure(
        fmt::format("{} links to section {}, which is not a string table", what, s.sh_link));
  out = &secs.headers[s.sh_link];
  return std::nullopt;
}

std::optional<ParseError> read_dynamic(const Reader& r, const Sections& secs, ElfInfo& out) {
  const Elf64_Shdr* dyn = secs.find(SHT_DYNAMIC);
  if (!dyn) return structure("no dynamic section: not a shared object");
  const Elf64_Shdr* str = nullptr;
  if (auto e = linked_strtab(secs, *dyn, "the dynamic section", str)) return e;
  uint64_t n = dyn->sh_size / sizeof(Elf64_Dyn);
  for (uint64_t i = 0; i < n; ++i) {
    Elf64_Dyn d;
    if (!r.read(dyn->sh_offset + i * sizeof(Elf64_Dyn), d)) break;
    if (d.d_tag == DT_NULL) break;
    std::vector<std::string>* list = nullptr;
    if (d.d_tag == DT_NEEDED) list = &out.needed;
    if (d.d_tag == DT_RPATH) list = &out.rpath;
    if (d.d_tag == DT_RUNPATH) list = &out.runpath;
    if (!list && d.d_tag != DT_SONAME) continue;
    std::string value;
    if (!r.string_in(str->sh_offset, str->sh_size, d.d_un.d_val, value))
      return structure(fmt::format("dynamic entry {} names a string outside .dynstr", i));
    if (list)
      list->push_back(std::move(value));
    else
      out.soname = std::move(value);
  }
  return std::nullopt;
}

std::optional<ParseError> read_dynsym(const Reader& r, const Sections& secs, ElfInfo& out) {
  const Elf64_Shdr* sym = secs.find(SHT_DYNSYM);
  if (!sym) return std::nullopt;  // no dynamic symbols: the entry check reports it
  if (sym->sh_entsize != sizeof(Elf64_Sym))
    return structure(
        fmt::format(".dynsym entry size is {}, expected {}", sym->sh_entsize, sizeof(Elf64_Sym)));
  const Elf64_Shdr* str = nullptr;
  if (auto e = linked_strtab(secs, *sym, ".dynsym", str)) return e;
  uint64_t n = sym->sh_size / sizeof(Elf64_Sym);
  for (uint64_t i = 1; i < n; ++i) {  // entry 0 is the null symbol
    Elf64_Sym s;
    r.read(sym->sh_offset + i * sizeof(Elf64_Sym), s);
    DynamicSymbol d;
    if (!r.string_in(str->sh_offset, str->sh_size, s.st_name, d.name))
      return structure(fmt::format("dynamic symbol {} has a name outside its string table", i));
    d.bind = ELF64_ST_BIND(s.st_info);
    d.type = ELF64_ST_TYPE(s.st_info);
    d.visibility = ELF64_ST_VISIBILITY(s.st_other);
    d.defined = s.st_shndx != SHN_UNDEF;
    out.dynamic_symbols.push_back(std::move(d));
  }
  return std::nullopt;
}

std::optional<ParseError> read_verneed(const Reader& r, const Sections& secs, ElfInfo& out) {
  const Elf64_Shdr* sec = secs.find(SHT_GNU_verneed);
  if (!sec) return std::nullopt;
  const Elf64_Shdr* str = nullptr;
  if (auto e = linked_strtab(secs, *sec, ".gnu.version_r", str)) return e;
  uint64_t off = 0, walked = 0;
  for (uint64_t i = 0; i < sec->sh_info; ++i) {
    Elf64_Verneed vn;
    if (off > sec->sh_size || sec->sh_size - off < sizeof vn || !r.read(sec->sh_offset + off, vn))
      return structure(".gnu.version_r entry lies outside its section");
    std::string file;
    if (!r.string_in(str->sh_offset, str->sh_size, vn.vn_file, file))
      return structure(".gnu.version_r names a file outside its string table");
    uint64_t aux = off + vn.vn_aux;
    for (uint64_t j = 0; j < vn.vn_cnt; ++j) {
      if (++walked > kMaxVersionEntries) return structure("too many version needs");
      Elf64_Vernaux va;
      if (aux > sec->sh_size || sec->sh_size - aux < sizeof va || !r.read(sec->sh_offset + aux, va))
        return structure(".gnu.version_r auxiliary entry lies outside its section");
      VersionNeed need{file, {}};
      if (!r.string_in(str->sh_offset, str->sh_size, va.vna_name, need.version))
        return structure(".gnu.version_r names a version outside its string table");
      out.version_needs.push_back(std::move(need));
      if (va.vna_next == 0) break;
      aux += va.vna_next;
    }
    if (vn.vn_next == 0) break;
    off += vn.vn_next;
  }
  return std::nullopt;
}

std::optional<ParseError> read_verdef(const Reader& r, const Sections& secs, ElfInfo& out) {
  const Elf64_Shdr* sec = secs.find(SHT_GNU_verdef);
  if (!sec) return std::nullopt;
  const Elf64_Shdr* str = nullptr;
  if (auto e = linked_strtab(secs, *sec, ".gnu.version_d", str)) return e;
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
      if (!r.string_in(str->sh_offset, str->sh_size, va.vda_name, name))
        return structure(".gnu.version_d names a version outside its string table");
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
  Sections secs;
  if (auto e = read_sections(r, eh, secs)) return e;
  if (auto e = read_dynamic(r, secs, out)) return e;
  if (auto e = read_dynsym(r, secs, out)) return e;
  if (auto e = read_verneed(r, secs, out)) return e;
  if (auto e = read_verdef(r, secs, out)) return e;
  return std::nullopt;
}

}  // namespace kh::elf
