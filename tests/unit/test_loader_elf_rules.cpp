// The preflight reads what ld.so reads. Libraries built with what ld.so acts on (DT_FILTER,
// DT_AUXILIARY, DT_AUDIT, DT_DEPAUDIT, text relocations, an executable stack, STB_GNU_UNIQUE;
// tests/packages/elf) are each refused by their rule alone, and byte-patched copies of the good
// toy library whose program headers or dynamic entries no longer match the section headers are
// refused by rule dynamic-segment (or elf-structure), never parsed from the sections instead.
#include <elf.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loader/elf_preflight.h"
#include "loader/package_check.h"
#include "tests/fixtures/process.h"
#include "tests/unit/test_loader_elf_util.h"

namespace kh {
namespace {

using namespace test_elf;

std::string elf_package(const std::string& name) {
  return std::string(KH_ELF_PACKAGES_DIR) + "/" + name;
}

std::string elf_library(const std::string& name) {
  return elf_package(name) + "/libtoy.so";
}

std::vector<std::string> failed_rules(const PreflightReport& r) {
  std::vector<std::string> out;
  for (const auto& c : r.checks)
    if (!c.passed) out.push_back(c.name);
  return out;
}

TEST(LoaderElfRules, BuiltLibrariesAreRefusedByTheirRuleAlone) {
  struct Case {
    const char* package;
    const char* rule;
    const char* mentions;
  };
  for (const Case& c : {Case{"elf-filter", "no-filters", "DT_FILTER libkh-filtee.so.1"},
                        Case{"elf-auxiliary", "no-filters", "DT_AUXILIARY libkh-auxiliary.so.1"},
                        Case{"elf-audit", "no-audit", "DT_AUDIT libkh-audit.so.1"},
                        Case{"elf-depaudit", "no-audit", "DT_DEPAUDIT libkh-depaudit.so.1"},
                        Case{"elf-textrel", "no-textrel", "DT_TEXTREL and DF_TEXTREL"},
                        Case{"elf-execstack", "no-execstack", "PT_GNU_STACK with PF_X"},
                        Case{"elf-unique", "no-gnu-unique", "_ZZ18elf_unique_countervE5count"}}) {
    SCOPED_TRACE(c.package);
    PreflightReport r = preflight_file(elf_library(c.package));
    expect_refused_by(r, c.rule, elf_library(c.package), c.mentions);
    EXPECT_EQ(failed_rules(r), std::vector<std::string>{c.rule}) << r.failures();
    // `kernel-hub check` stops at the preflight: nothing is loaded, not even in a child.
    PackageCheck check = check_package(elf_package(c.package));
    EXPECT_FALSE(check.ok());
    EXPECT_EQ(find_check(check.report, "dlopen"), nullptr) << check.to_text();
    EXPECT_FALSE(test::is_loaded(elf_library(c.package)));
  }
  // The constructor library differs in nothing the preflight refuses.
  EXPECT_TRUE(preflight_file(elf_library("elf-ctor")).ok())
      << preflight_file(elf_library("elf-ctor")).failures();
}

// ld.so reads DT_TEXTREL and DF_TEXTREL alike: either alone is refused.
TEST(LoaderElfRules, EitherTextRelocationMarkIsRefused) {
  const Bytes built = read_bytes(elf_library("elf-textrel"));
  Bytes b = built;
  put<int64_t>(b, dyn_entries(b, DT_TEXTREL).at(0), DT_DEBUG);
  expect_refused_by(preflight_elf(b, "df.so"), "no-textrel", "df.so", "(DF_TEXTREL in DT_FLAGS)");
  b = built;
  size_t flags = dyn_entries(b, DT_FLAGS).at(0);
  put<uint64_t>(b, flags + 8, get<uint64_t>(b, flags + 8) & ~uint64_t{DF_TEXTREL});
  expect_refused_by(preflight_elf(b, "dt.so"), "no-textrel", "dt.so", "(DT_TEXTREL)");
}

// Without PT_GNU_STACK, ld.so gives the process an executable stack.
TEST(LoaderElfRules, MissingGnuStackMeansAnExecutableStack) {
  Bytes b = read_bytes(toy("toy-1.0.0"));
  put<uint32_t>(b, phdrs(b, PT_GNU_STACK).at(0), PT_NULL);
  expect_refused_by(preflight_elf(b, "nostack.so"), "no-execstack", "nostack.so",
                    "no PT_GNU_STACK");
  b = read_bytes(toy("toy-1.0.0"));
  size_t stack = phdrs(b, PT_GNU_STACK).at(0);
  put<uint32_t>(b, stack + offsetof(Elf64_Phdr, p_flags), PF_R | PF_W | PF_X);
  expect_refused_by(preflight_elf(b, "rwx.so"), "no-execstack", "rwx.so", "PF_X");
}

// One field of the good toy library patched; the rule and a phrase of the message expected.
struct Patch {
  const char* what;
  void (*apply)(Bytes&);
  const char* rule;
  const char* mentions;
};

void move_dynamic(Bytes& b, int64_t by) {
  size_t at = phdrs(b, PT_DYNAMIC).at(0);
  put<uint64_t>(b, at + offsetof(Elf64_Phdr, p_offset),
                get<uint64_t>(b, at + offsetof(Elf64_Phdr, p_offset)) + by);
  put<uint64_t>(b, at + offsetof(Elf64_Phdr, p_vaddr),
                get<uint64_t>(b, at + offsetof(Elf64_Phdr, p_vaddr)) + by);
}

void add_to(Bytes& b, size_t at, int64_t by) {
  put<uint64_t>(b, at, get<uint64_t>(b, at) + by);
}

const Patch kPatches[] = {
    // PT_DYNAMIC moved (consistently, inside its segment): ld.so would read other entries than
    // the .dynamic section's.
    {"PT_DYNAMIC moved by one entry", [](Bytes& b) { move_dynamic(b, sizeof(Elf64_Dyn)); },
     "dynamic-segment", "and the .dynamic section"},
    {"PT_DYNAMIC shorter than .dynamic",
     [](Bytes& b) {
       add_to(b, phdrs(b, PT_DYNAMIC).at(0) + offsetof(Elf64_Phdr, p_filesz),
              -int64_t{sizeof(Elf64_Dyn)});
     },
     "dynamic-segment", "disagree"},
    {"PT_DYNAMIC's offset not where its address loads from",
     [](Bytes& b) { add_to(b, phdrs(b, PT_DYNAMIC).at(0) + offsetof(Elf64_Phdr, p_offset), 16); },
     "dynamic-segment", "which is what ld.so reads"},
    {"PT_DYNAMIC outside every PT_LOAD",
     [](Bytes& b) {
       put<uint64_t>(b, phdrs(b, PT_DYNAMIC).at(0) + offsetof(Elf64_Phdr, p_vaddr),
                     uint64_t{1} << 40);
     },
     "dynamic-segment", "does not lie inside a PT_LOAD"},
    {"no PT_DYNAMIC", [](Bytes& b) { put<uint32_t>(b, phdrs(b, PT_DYNAMIC).at(0), PT_NULL); },
     "dynamic-segment", "no PT_DYNAMIC"},
    {"two PT_DYNAMIC", [](Bytes& b) { put<uint32_t>(b, phdrs(b, PT_GNU_RELRO).at(0), PT_DYNAMIC); },
     "dynamic-segment", "two PT_DYNAMIC"},
    {"no .dynamic section", [](Bytes& b) { put<uint32_t>(b, *shdr(b, SHT_DYNAMIC) + 4, 1); },
     "dynamic-segment", "no .dynamic section"},
    {"no DT_NULL inside PT_DYNAMIC",
     [](Bytes& b) {
       for (size_t at : dyn_entries(b, DT_NULL)) put<int64_t>(b, at, DT_DEBUG);
     },
     "dynamic-segment", "no DT_NULL"},
    {"DT_STRTAB twice", [](Bytes& b) { put<int64_t>(b, dyn_entries(b, DT_FINI).at(0), DT_STRTAB); },
     "dynamic-segment", "appears twice"},
    {"DT_SYMTAB not .dynsym",
     [](Bytes& b) { add_to(b, dyn_entries(b, DT_SYMTAB).at(0) + 8, sizeof(Elf64_Sym)); },
     "dynamic-segment", "DT_SYMTAB"},
    {".dynsym not where DT_SYMTAB points",
     [](Bytes& b) {
       add_to(b, *shdr(b, SHT_DYNSYM) + offsetof(Elf64_Shdr, sh_offset), sizeof(Elf64_Sym));
     },
     "dynamic-segment", "is not what ld.so loads at DT_SYMTAB"},
    {"DT_STRSZ not .dynstr's size",
     [](Bytes& b) { add_to(b, dyn_entries(b, DT_STRSZ).at(0) + 8, -1); }, "dynamic-segment",
     "string table"},
    {"DT_GNU_HASH reaching past .dynsym",
     [](Bytes& b) {
       add_to(b, *shdr(b, SHT_DYNSYM) + offsetof(Elf64_Shdr, sh_size), -int64_t{sizeof(Elf64_Sym)});
     },
     "dynamic-segment", "DT_GNU_HASH"},
    {"PT_LOAD segments overlapping",
     [](Bytes& b) {
       auto loads = phdrs(b, PT_LOAD);
       put<uint64_t>(b, loads.at(1) + offsetof(Elf64_Phdr, p_vaddr), 0);
     },
     "elf-structure", "overlaps"},
    {"PT_LOAD past the end of the file",
     [](Bytes& b) {
       size_t load = phdrs(b, PT_LOAD).at(1);
       put<uint64_t>(b, load + offsetof(Elf64_Phdr, p_filesz), uint64_t{1} << 40);
       put<uint64_t>(b, load + offsetof(Elf64_Phdr, p_memsz), uint64_t{1} << 40);
     },
     "elf-structure", "past the end"},
    {"program header count PN_XNUM",
     [](Bytes& b) { put<uint16_t>(b, offsetof(Elf64_Ehdr, e_phnum), PN_XNUM); }, "elf-structure",
     "out of range"},
    {"program header table past the end",
     [](Bytes& b) { put<uint64_t>(b, offsetof(Elf64_Ehdr, e_phoff), b.size() - 8); },
     "elf-structure", "past the end"},
    {"DT_SYMENT wrong", [](Bytes& b) { add_to(b, dyn_entries(b, DT_SYMENT).at(0) + 8, 1); },
     "elf-structure", "DT_SYMENT"},
};

TEST(LoaderElfRules, ProgramHeadersAndSectionsMustAgree) {
  const Bytes good = read_bytes(toy("toy-1.0.0"));
  ASSERT_TRUE(preflight_elf(good, "good.so").ok());
  for (const Patch& p : kPatches) {
    SCOPED_TRACE(p.what);
    Bytes b = good;
    p.apply(b);
    PreflightReport r = preflight_elf(b, "patched.so");
    expect_refused_by(r, p.rule, "patched.so", p.mentions);
  }
}

}  // namespace
}  // namespace kh
