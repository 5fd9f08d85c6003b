// ELF preflight: the toy package variants each pass or fail with their rule named; the reader
// survives a corpus of mutated ELF files (the fuzz entry, run under g++ in CI).
#include <elf.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hub/base/fs.h"
#include "loader/elf_preflight.h"
#include "loader/host_versions.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace kh {
namespace {

using Bytes = std::vector<uint8_t>;

std::string toy(const std::string& variant) {
  return std::string(KH_TOY_PACKAGES_DIR) + "/" + variant + "/libtoy.so";
}

Bytes read_bytes(const std::string& path) {
  std::string s = fs::read_file(path);
  return Bytes(s.begin(), s.end());
}

const Check* find_check(const PreflightReport& r, const std::string& name) {
  for (const auto& c : r.checks)
    if (c.name == name) return &c;
  return nullptr;
}

// Asserts that the report failed exactly by `rule`, and that the message names file and rule.
void expect_refused_by(const PreflightReport& r, const std::string& rule, const std::string& file,
                       const std::string& mentions) {
  EXPECT_FALSE(r.ok());
  const Check* c = find_check(r, rule);
  ASSERT_NE(c, nullptr) << "no check named " << rule << "; failures: " << r.failures();
  EXPECT_FALSE(c->passed);
  EXPECT_NE(c->message.find(file), std::string::npos) << c->message;
  EXPECT_NE(c->message.find("rule " + rule), std::string::npos) << c->message;
  EXPECT_NE(c->message.find(mentions), std::string::npos) << c->message;
}

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
  for (const char* name : {"elf-header", "needed-libraries", "no-rpath", "symbol-versions",
                           "entry-symbol", "exports"}) {
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

// Byte ranges worth mutating: the ELF header, the section table and the sections the reader
// walks (dynamic, dynsym, strings, version needs and definitions).
std::vector<std::pair<size_t, size_t>> interesting_ranges(const Bytes& b) {
  std::vector<std::pair<size_t, size_t>> out{{0, sizeof(Elf64_Ehdr)}};
  Elf64_Ehdr eh;
  std::memcpy(&eh, b.data(), sizeof eh);
  out.push_back({eh.e_shoff, size_t{eh.e_shnum} * sizeof(Elf64_Shdr)});
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr s;
    std::memcpy(&s, b.data() + eh.e_shoff + i * sizeof s, sizeof s);
    if (s.sh_type == SHT_DYNAMIC || s.sh_type == SHT_DYNSYM || s.sh_type == SHT_STRTAB ||
        s.sh_type == SHT_GNU_verneed || s.sh_type == SHT_GNU_verdef)
      out.push_back({s.sh_offset, s.sh_size});
  }
  return out;
}

TEST(LoaderElf, FuzzEntrySurvivesMutatedCorpus) {
  std::vector<Bytes> seeds = {read_bytes(toy("toy-1.0.0")), read_bytes(KH_LIBKERNEL_HUB)};
  std::mt19937_64 rng(20250101);
  size_t runs = 0;
  auto run = [&](const Bytes& b) {
    EXPECT_EQ(LLVMFuzzerTestOneInput(b.data(), b.size()), 0);
    ++runs;
  };
  for (const Bytes& seed : seeds) {
    run(seed);
    // Truncations: every length through the header and section table, then a sample.
    size_t step = std::max<size_t>(61, seed.size() / 300);
    for (size_t n = 0; n < seed.size(); n += (n < 512 ? 1 : step))
      run(Bytes(seed.begin(), seed.begin() + n));
    auto ranges = interesting_ranges(seed);
    // Every header byte set to boundary values.
    for (size_t i = 0; i < sizeof(Elf64_Ehdr); ++i)
      for (uint8_t v : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
        Bytes b = seed;
        b[i] = v;
        run(b);
      }
    // Section header fields set to hostile values (offsets, sizes, links, counts).
    Elf64_Ehdr eh;
    std::memcpy(&eh, seed.data(), sizeof eh);
    for (size_t i = 0; i < eh.e_shnum; ++i) {
      size_t base = eh.e_shoff + i * sizeof(Elf64_Shdr);
      for (size_t field : {offsetof(Elf64_Shdr, sh_offset), offsetof(Elf64_Shdr, sh_size),
                           offsetof(Elf64_Shdr, sh_link), offsetof(Elf64_Shdr, sh_info),
                           offsetof(Elf64_Shdr, sh_entsize)})
        for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{0xffffffff}, ~uint64_t{0},
                           uint64_t{seed.size()}}) {
          Bytes b = seed;
          size_t width =
              (field == offsetof(Elf64_Shdr, sh_link) || field == offsetof(Elf64_Shdr, sh_info))
                  ? 4
                  : 8;
          std::memcpy(b.data() + base + field, &v, width);
          run(b);
        }
    }
    // Random mutations inside the interesting ranges: 1 to 8 bytes each.
    int mutations = seed.size() < (256u << 10) ? 3000 : 300;  // big seeds cost more per run
    for (int i = 0; i < mutations; ++i) {
      Bytes b = seed;
      int flips = 1 + static_cast<int>(rng() % 8);
      for (int f = 0; f < flips; ++f) {
        auto [off, len] = ranges[rng() % ranges.size()];
        if (len == 0 || off >= b.size()) continue;
        size_t at = off + rng() % std::min(len, b.size() - off);
        b[at] = static_cast<uint8_t>(rng());
      }
      run(b);
    }
  }
  EXPECT_GT(runs, 5000u);
}

}  // namespace
}  // namespace kh
