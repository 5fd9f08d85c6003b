// ELF preflight: the toy package variants each pass or fail with their rule named; the reader
// survives a corpus of mutated ELF files (the fuzz entry, run under g++ in CI).
#include <elf.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "loader/elf_preflight.h"
#include "loader/host_versions.h"
#include "tests/unit/test_loader_elf_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed);

namespace kh {
namespace {

using namespace test_elf;

uint16_t other_machine() {
#if defined(__x86_64__)
  return EM_AARCH64;
#else
  return EM_X86_64;
#endif
}

TEST(LoaderElf, GoodPackagePassesEveryCheck) {
  PreflightReport r = preflight_file(toy("toy-1.0.0"));
  EXPECT_TRUE(r.ok()) << r.failures();
  for (const char* name :
       {"elf-header", "needed-libraries", "no-rpath", "no-filters", "no-audit", "no-textrel",
        "no-execstack", "no-gnu-unique", "symbol-versions", "entry-symbol", "exports"}) {
    const Check* c = find_check(r, name);
    ASSERT_NE(c, nullptr) << name;
    EXPECT_TRUE(c->passed) << c->message;
  }
  EXPECT_FALSE(find_check(r, "exports")->warning) << find_check(r, "exports")->message;
}

TEST(LoaderElf, MissingEntrySymbolIsRefused) {
  expect_refused_by(preflight_file(toy("toy-no-entry")), "entry-symbol", toy("toy-no-entry"),
                    "kh_module_v1");
}

TEST(LoaderElf, CudaRuntimeIsRefusedByName) {
  PreflightReport r = preflight_file(toy("toy-cudart"));
  expect_refused_by(r, "needed-libraries", toy("toy-cudart"), "libcudart.so.13");
  EXPECT_NE(find_check(r, "needed-libraries")->message.find("CUDA runtime"), std::string::npos);
}

TEST(LoaderElf, RpathIsRefused) {
  expect_refused_by(preflight_file(toy("toy-rpath")), "no-rpath", toy("toy-rpath"),
                    "/opt/elsewhere/lib");
}

TEST(LoaderElf, AnotherMachineIsRefused) {
  Bytes b = read_bytes(toy("toy-1.0.0"));
  uint16_t m = other_machine();
  std::memcpy(b.data() + offsetof(Elf64_Ehdr, e_machine), &m, sizeof m);
  PreflightReport r = preflight_elf(b, "patched.so");
  expect_refused_by(r, "elf-header", "patched.so", m == EM_AARCH64 ? "AArch64" : "x86-64");
  EXPECT_EQ(r.checks.size(), 1u) << "nothing past the header is checked for another machine";
}

TEST(LoaderElf, HeaderRulesRefuseOtherClassesAndTypes) {
  Bytes good = read_bytes(toy("toy-1.0.0"));
  Bytes b = good;
  b[EI_CLASS] = ELFCLASS32;
  expect_refused_by(preflight_elf(b, "c32.so"), "elf-header", "c32.so", "ELFCLASS64");
  b = good;
  b[EI_DATA] = ELFDATA2MSB;
  expect_refused_by(preflight_elf(b, "be.so"), "elf-header", "be.so", "little-endian");
  b = good;
  uint16_t exec = ET_EXEC;
  std::memcpy(b.data() + offsetof(Elf64_Ehdr, e_type), &exec, sizeof exec);
  expect_refused_by(preflight_elf(b, "exec.so"), "elf-header", "exec.so", "ET_DYN");
  expect_refused_by(preflight_elf(Bytes{'#', '!'}, "script"), "elf-header", "script", "magic");
  expect_refused_by(preflight_file("/nonexistent/libx.so"), "readable", "/nonexistent/libx.so", "");
}

TEST(LoaderElf, HostVersionsComeFromThisProcessLibraries) {
  const HostVersions& h = HostVersions::current();
  ASSERT_TRUE(h.max.count("GLIBC")) << "libc.so.6 not found via dl_iterate_phdr";
  ASSERT_TRUE(h.max.count("GLIBCXX")) << "libstdc++.so.6 not found";
  ASSERT_TRUE(h.max.count("CXXABI"));
  EXPECT_FALSE(h.max.at("GLIBC") < *SymbolVersion::parse("GLIBC_2.17"));
  EXPECT_FALSE(h.max.at("GLIBCXX") < *SymbolVersion::parse("GLIBCXX_3.4.20"));
  EXPECT_NE(h.provider.at("GLIBC").find("libc.so.6"), std::string::npos);
}

TEST(LoaderElf, SymbolVersionParsingAndOrder) {
  auto a = SymbolVersion::parse("GLIBCXX_3.4.9");
  auto b = SymbolVersion::parse("GLIBCXX_3.4.30");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->prefix, "GLIBCXX");
  EXPECT_TRUE(*a < *b);  // numeric, not lexical
  EXPECT_EQ(b->str(), "GLIBCXX_3.4.30");
  EXPECT_FALSE(SymbolVersion::parse("GLIBC_PRIVATE"));
  EXPECT_FALSE(SymbolVersion::parse("GLIBC_2."));
  EXPECT_FALSE(SymbolVersion::parse("nounderscore"));
}

// libkernel_hub.so needs GLIBC_ and GLIBCXX_ versions: it passes this host's maxima and fails
// a host that is older than it needs.
TEST(LoaderElf, SymbolVersionsAboveTheHostAreRefused) {
  Bytes lib = read_bytes(KH_LIBKERNEL_HUB);
  PreflightReport here = preflight_elf(lib, "libkernel_hub.so");
  const Check* c = find_check(here, "symbol-versions");
  ASSERT_NE(c, nullptr) << here.failures();
  EXPECT_TRUE(c->passed) << c->message;
  // (it fails other rules: it needs libfmt and has no kh_module_v1)
  EXPECT_FALSE(find_check(here, "entry-symbol")->passed);

  HostVersions old;
  old.max["GLIBC"] = *SymbolVersion::parse("GLIBC_2.2.5");
  old.max["GLIBCXX"] = *SymbolVersion::parse("GLIBCXX_3.4");
  old.max["CXXABI"] = *SymbolVersion::parse("CXXABI_1.3");
  PreflightReport there = preflight_elf(lib, "libkernel_hub.so", old);
  expect_refused_by(there, "symbol-versions", "libkernel_hub.so", "this host provides at most");

  HostVersions no_cxx;
  no_cxx.max["GLIBC"] = HostVersions::current().max.at("GLIBC");
  expect_refused_by(preflight_elf(lib, "libkernel_hub.so", no_cxx), "symbol-versions",
                    "libkernel_hub.so", "no library providing GLIBCXX");
}

// Byte ranges worth mutating: what ld.so acts on (ELF header, program headers, dynamic segment),
// the section table and the sections the reader walks (dynamic, dynsym, strings, versions).
std::vector<std::pair<size_t, size_t>> interesting_ranges(const Bytes& b) {
  std::vector<std::pair<size_t, size_t>> out = loader_ranges(b);
  Elf64_Ehdr eh = header(b);
  out.push_back({eh.e_shoff, size_t{eh.e_shnum} * sizeof(Elf64_Shdr)});
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr s = get<Elf64_Shdr>(b, eh.e_shoff + i * sizeof(Elf64_Shdr));
    if (s.sh_type == SHT_DYNAMIC || s.sh_type == SHT_DYNSYM || s.sh_type == SHT_STRTAB ||
        s.sh_type == SHT_GNU_verneed || s.sh_type == SHT_GNU_verdef || s.sh_type == SHT_GNU_HASH)
      out.push_back({s.sh_offset, s.sh_size});
  }
  return out;
}

// Runs the fuzz entry on `work` with `width` bytes at `at` set to `value`, then restores them
// (libkernel_hub.so is tens of MiB: copying it per run would dominate the test).
class Mutator {
 public:
  explicit Mutator(const Bytes& seed) : work_(seed) {}
  size_t runs = 0;

  void run() {
    EXPECT_EQ(LLVMFuzzerTestOneInput(work_.data(), work_.size()), 0);
    ++runs;
  }
  void run_prefix(size_t n) {
    EXPECT_EQ(LLVMFuzzerTestOneInput(work_.data(), n), 0);
    ++runs;
  }
  void run_with(size_t at, uint64_t value, size_t width) {
    if (at + width > work_.size()) return;
    uint8_t saved[8];
    std::memcpy(saved, work_.data() + at, width);
    std::memcpy(work_.data() + at, &value, width);
    run();
    std::memcpy(work_.data() + at, saved, width);
  }
  // Several random bytes at once, inside `ranges`.
  void run_random(const std::vector<std::pair<size_t, size_t>>& ranges, std::mt19937_64& rng) {
    std::vector<std::pair<size_t, uint8_t>> saved;
    int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) {
      auto [off, len] = ranges[rng() % ranges.size()];
      if (len == 0 || off >= work_.size()) continue;
      size_t at = off + rng() % std::min(len, work_.size() - off);
      saved.push_back({at, work_[at]});
      work_[at] = static_cast<uint8_t>(rng());
    }
    run();
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) work_[it->first] = it->second;
  }

 private:
  Bytes work_;
};

TEST(LoaderElf, FuzzEntrySurvivesMutatedCorpus) {
  std::vector<Bytes> seeds = {read_bytes(toy("toy-1.0.0")), read_bytes(KH_LIBKERNEL_HUB)};
  std::mt19937_64 rng(20250101);
  size_t runs = 0;
  const std::vector<uint64_t> hostile = {0, 1, 0xffffffff, ~uint64_t{0}, 0x7fffffffffffffff};
  for (const Bytes& seed : seeds) {
    Mutator m(seed);
    m.run();
    // Truncations: every length through the headers, then a sample.
    size_t step = std::max<size_t>(61, seed.size() / 300);
    for (size_t n = 0; n < seed.size(); n += (n < 512 ? 1 : step)) m.run_prefix(n);
    // Every header byte set to boundary values.
    for (size_t i = 0; i < sizeof(Elf64_Ehdr); ++i)
      for (uint8_t v : {0x00, 0x01, 0x7f, 0x80, 0xff}) m.run_with(i, v, 1);
    Elf64_Ehdr eh = header(seed);
    // Program header fields set to hostile values, and to the file size.
    for (size_t i = 0; i < eh.e_phnum; ++i) {
      size_t base = eh.e_phoff + i * sizeof(Elf64_Phdr);
      for (uint32_t type : {PT_NULL, PT_LOAD, PT_DYNAMIC, PT_GNU_STACK})
        m.run_with(base + offsetof(Elf64_Phdr, p_type), type, 4);
      m.run_with(base + offsetof(Elf64_Phdr, p_flags), PF_R | PF_W | PF_X, 4);
      for (size_t field : {offsetof(Elf64_Phdr, p_offset), offsetof(Elf64_Phdr, p_vaddr),
                           offsetof(Elf64_Phdr, p_filesz), offsetof(Elf64_Phdr, p_memsz)}) {
        for (uint64_t v : hostile) m.run_with(base + field, v, 8);
        m.run_with(base + field, seed.size(), 8);
        m.run_with(base + field, get<uint64_t>(seed, base + field) + 8, 8);
      }
    }
    // Dynamic entries: every tag replaced by the ones the rules act on, every value hostile.
    Elf64_Phdr dyn = get<Elf64_Phdr>(seed, phdrs(seed, PT_DYNAMIC).at(0));
    for (size_t at = dyn.p_offset; at + sizeof(Elf64_Dyn) <= dyn.p_offset + dyn.p_filesz;
         at += sizeof(Elf64_Dyn)) {
      for (int64_t tag :
           {DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SYMTAB, DT_GNU_HASH, DT_HASH, DT_FILTER,
            DT_AUXILIARY, DT_AUDIT, DT_TEXTREL, DT_FLAGS, DT_VERNEED, DT_VERDEF})
        m.run_with(at, static_cast<uint64_t>(tag), 8);
      for (uint64_t v : hostile) m.run_with(at + 8, v, 8);
    }
    // Section header fields set to hostile values (offsets, sizes, links, counts).
    for (size_t i = 0; i < eh.e_shnum; ++i) {
      size_t base = eh.e_shoff + i * sizeof(Elf64_Shdr);
      for (size_t field : {offsetof(Elf64_Shdr, sh_offset), offsetof(Elf64_Shdr, sh_size),
                           offsetof(Elf64_Shdr, sh_link), offsetof(Elf64_Shdr, sh_info),
                           offsetof(Elf64_Shdr, sh_entsize)})
        for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{0xffffffff}, ~uint64_t{0},
                           uint64_t{seed.size()}}) {
          size_t width =
              (field == offsetof(Elf64_Shdr, sh_link) || field == offsetof(Elf64_Shdr, sh_info))
                  ? 4
                  : 8;
          m.run_with(base + field, v, width);
        }
    }
    // Random mutations: 1 to 8 bytes each, in what ld.so reads and in what the reader walks.
    auto loader = loader_ranges(seed);
    auto all = interesting_ranges(seed);
    for (int i = 0; i < 3000; ++i) m.run_random(i % 2 ? loader : all, rng);
    runs += m.runs;
  }
  // The fuzz target's own mutator (ld.so's view: header, program headers, dynamic entries),
  // stacked 1 to 4 deep on the small seed.
  const Bytes& small = seeds.front();
  for (unsigned i = 0; i < 3000; ++i) {
    Bytes b = small;
    for (unsigned k = 0; k <= i % 4; ++k)
      ASSERT_EQ(LLVMFuzzerCustomMutator(b.data(), b.size(), b.size(), i * 4 + k), b.size());
    EXPECT_EQ(LLVMFuzzerTestOneInput(b.data(), b.size()), 0);
    ++runs;
  }
  EXPECT_GT(runs, 13000u);
}

}  // namespace
}  // namespace kh
