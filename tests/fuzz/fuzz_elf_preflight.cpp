// libFuzzer target for the ELF preflight: it parses untrusted package host libraries, so any
// byte string must yield a report, never a crash or an out-of-bounds read. Built with clang by
// tests/fuzz/run.sh (fuzz.elf_preflight in CTest); the GoogleTest test_loader_elf runs this same
// entry over a corpus of mutated ELF files so that CI exercises it with g++ too.
//
// A custom mutator aims half of the mutations at what ld.so reads: one field of the ELF header,
// of a program header or of a dynamic entry set to a boundary value, a neighbour's value or a tag
// the rules act on (DT_FILTER, DT_AUDIT, DT_TEXTREL, ...). Seeds (corpus/elf_preflight) include
// libraries with those tags.
#include <elf.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>

#include "loader/elf_preflight.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Fixed host versions: the fuzzer must not depend on this machine's libraries.
  static const kh::HostVersions host = [] {
    kh::HostVersions h;
    h.max["GLIBC"] = *kh::SymbolVersion::parse("GLIBC_2.36");
    h.max["GLIBCXX"] = *kh::SymbolVersion::parse("GLIBCXX_3.4.30");
    h.max["CXXABI"] = *kh::SymbolVersion::parse("CXXABI_1.3.13");
    return h;
  }();
  kh::PreflightReport report = kh::preflight_elf(std::span(data, size), "fuzz-input", host);
  // Touch the results so that every string was really built.
  size_t total = 0;
  for (const auto& c : report.checks) total += c.message.size() + c.name.size();
  return total == SIZE_MAX ? 1 : 0;
}

namespace {

// A value worth writing into a field that held `old` in a file of `size` bytes.
uint64_t interesting_value(uint64_t old, size_t size, std::minstd_rand& rng) {
  switch (rng() % 8) {
    case 0:
      return 0;
    case 1:
      return ~uint64_t{0};
    case 2:
      return size;
    case 3:
      return old + 8 * (1 + rng() % 4);
    case 4:
      return old - 8 * (1 + rng() % 4);
    case 5:
      return uint64_t{1} << (rng() % 64);
    case 6:
      return old ^ (uint64_t{1} << (rng() % 64));
    default:
      return rng() % 4096;
  }
}

template <typename T>
void set_field(uint8_t* data, size_t at, uint64_t value) {
  T v = static_cast<T>(value);
  std::memcpy(data + at, &v, sizeof v);
}

template <typename T>
uint64_t field(const uint8_t* data, size_t at) {
  T v;
  std::memcpy(&v, data + at, sizeof v);
  return v;
}

// One field of the ELF header, a program header or a dynamic entry changed in place; false when
// the input has no usable ELF header or program header table.
bool mutate_loader_view(uint8_t* data, size_t size, std::minstd_rand& rng) {
  if (size < sizeof(Elf64_Ehdr)) return false;
  Elf64_Ehdr eh;
  std::memcpy(&eh, data, sizeof eh);
  const bool have_phdrs = eh.e_phentsize == sizeof(Elf64_Phdr) && eh.e_phnum > 0 &&
                          eh.e_phoff < size &&
                          (size - eh.e_phoff) / sizeof(Elf64_Phdr) >= eh.e_phnum;
  unsigned what = have_phdrs ? rng() % 3 : 0;
  if (what == 0) {  // the header fields that locate and count the tables
    static constexpr size_t kFields[] = {offsetof(Elf64_Ehdr, e_phoff),
                                         offsetof(Elf64_Ehdr, e_shoff)};
    static constexpr size_t kShort[] = {offsetof(Elf64_Ehdr, e_phnum),
                                        offsetof(Elf64_Ehdr, e_phentsize),
                                        offsetof(Elf64_Ehdr, e_shnum)};
    if (rng() % 2) {
      size_t at = kFields[rng() % 2];
      set_field<uint64_t>(data, at, interesting_value(field<uint64_t>(data, at), size, rng));
    } else {
      size_t at = kShort[rng() % 3];
      set_field<uint16_t>(data, at, interesting_value(field<uint16_t>(data, at), size, rng));
    }
    return true;
  }
  size_t phdr = eh.e_phoff + (rng() % eh.e_phnum) * sizeof(Elf64_Phdr);
  if (what == 1) {  // a program header: type, flags, or a range
    switch (rng() % 3) {
      case 0: {
        static constexpr uint32_t kTypes[] = {PT_NULL, PT_LOAD, PT_DYNAMIC, PT_GNU_STACK,
                                              PT_GNU_RELRO};
        set_field<uint32_t>(data, phdr, kTypes[rng() % 5]);
        break;
      }
      case 1:
        set_field<uint32_t>(data, phdr + offsetof(Elf64_Phdr, p_flags), rng() % 8);
        break;
      default: {
        static constexpr size_t kRange[] = {
            offsetof(Elf64_Phdr, p_offset), offsetof(Elf64_Phdr, p_vaddr),
            offsetof(Elf64_Phdr, p_filesz), offsetof(Elf64_Phdr, p_memsz)};
        size_t at = phdr + kRange[rng() % 4];
        set_field<uint64_t>(data, at, interesting_value(field<uint64_t>(data, at), size, rng));
      }
    }
    return true;
  }
  // A dynamic entry: find PT_DYNAMIC's file image.
  for (size_t i = 0; i < eh.e_phnum; ++i) {
    size_t at = eh.e_phoff + i * sizeof(Elf64_Phdr);
    Elf64_Phdr p;
    std::memcpy(&p, data + at, sizeof p);
    if (p.p_type != PT_DYNAMIC || p.p_offset >= size || p.p_filesz < sizeof(Elf64_Dyn)) continue;
    size_t count = std::min<uint64_t>(p.p_filesz, size - p.p_offset) / sizeof(Elf64_Dyn);
    if (count == 0) return false;
    size_t entry = p.p_offset + (rng() % count) * sizeof(Elf64_Dyn);
    if (rng() % 2) {
      static constexpr int64_t kTags[] = {
          DT_NULL,       DT_NEEDED,   DT_STRTAB,    DT_STRSZ,   DT_SYMTAB,  DT_SYMENT,
          DT_HASH,       DT_GNU_HASH, DT_SONAME,    DT_RPATH,   DT_RUNPATH, DT_FILTER,
          DT_AUXILIARY,  DT_AUDIT,    DT_DEPAUDIT,  DT_TEXTREL, DT_FLAGS,   DT_VERNEED,
          DT_VERNEEDNUM, DT_VERDEF,   DT_VERDEFNUM, DT_VERSYM,  DT_RELAENT, DT_PLTREL};
      set_field<int64_t>(data, entry, kTags[rng() % (sizeof kTags / sizeof kTags[0])]);
    } else {
      set_field<uint64_t>(data, entry + 8,
                          interesting_value(field<uint64_t>(data, entry + 8), size, rng));
    }
    return true;
  }
  return false;
}

}  // namespace

// libFuzzer's own mutation; absent (null) outside libFuzzer builds, which never call the mutator.
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size)
    __attribute__((weak));

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  std::minstd_rand rng(seed);
  if (rng() % 2 && mutate_loader_view(data, size, rng)) return size;
  return LLVMFuzzerMutate ? LLVMFuzzerMutate(data, size, max_size) : size;
}
