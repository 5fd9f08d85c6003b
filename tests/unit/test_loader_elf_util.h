// Helpers of the ELF preflight tests: the built test libraries, their bytes, where the headers
// and dynamic entries sit in them (to patch one field), and the refusal assertion.
#pragma once

#include <elf.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "hub/base/fs.h"
#include "loader/elf_preflight.h"

namespace kh::test_elf {

using Bytes = std::vector<uint8_t>;

inline std::string toy(const std::string& variant) {
  return std::string(KH_TOY_PACKAGES_DIR) + "/" + variant + "/libtoy.so";
}

inline Bytes read_bytes(const std::string& path) {
  std::string s = fs::read_file(path);
  return Bytes(s.begin(), s.end());
}

template <typename T>
T get(const Bytes& b, size_t offset) {
  T v;
  std::memcpy(&v, b.data() + offset, sizeof v);
  return v;
}

template <typename T>
void put(Bytes& b, size_t offset, T v) {
  std::memcpy(b.data() + offset, &v, sizeof v);
}

inline Elf64_Ehdr header(const Bytes& b) {
  return get<Elf64_Ehdr>(b, 0);
}

// File offsets of the program headers of `type`, in table order.
inline std::vector<size_t> phdrs(const Bytes& b, uint32_t type) {
  Elf64_Ehdr eh = header(b);
  std::vector<size_t> out;
  for (size_t i = 0; i < eh.e_phnum; ++i) {
    size_t at = eh.e_phoff + i * sizeof(Elf64_Phdr);
    if (get<Elf64_Phdr>(b, at).p_type == type) out.push_back(at);
  }
  return out;
}

// File offset of the first section header of `type`; nullopt when there is none.
inline std::optional<size_t> shdr(const Bytes& b, uint32_t type) {
  Elf64_Ehdr eh = header(b);
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    size_t at = eh.e_shoff + i * sizeof(Elf64_Shdr);
    if (get<Elf64_Shdr>(b, at).sh_type == type) return at;
  }
  return std::nullopt;
}

// File offsets of the dynamic entries (PT_DYNAMIC's file image) of `tag` (DT_NULL included).
inline std::vector<size_t> dyn_entries(const Bytes& b, int64_t tag) {
  Elf64_Phdr d = get<Elf64_Phdr>(b, phdrs(b, PT_DYNAMIC).at(0));
  std::vector<size_t> out;
  for (size_t at = d.p_offset; at + sizeof(Elf64_Dyn) <= d.p_offset + d.p_filesz;
       at += sizeof(Elf64_Dyn))
    if (get<Elf64_Dyn>(b, at).d_tag == tag) out.push_back(at);
  return out;
}

inline const Check* find_check(const PreflightReport& r, const std::string& name) {
  for (const auto& c : r.checks)
    if (c.name == name) return &c;
  return nullptr;
}

// Asserts that the report failed by `rule`, and that the message names file and rule.
inline void expect_refused_by(const PreflightReport& r, const std::string& rule,
                              const std::string& file, const std::string& mentions) {
  EXPECT_FALSE(r.ok());
  const Check* c = find_check(r, rule);
  ASSERT_NE(c, nullptr) << "no check named " << rule << "; failures: " << r.failures();
  EXPECT_FALSE(c->passed);
  EXPECT_NE(c->message.find(file), std::string::npos) << c->message;
  EXPECT_NE(c->message.find("rule " + rule), std::string::npos) << c->message;
  EXPECT_NE(c->message.find(mentions), std::string::npos) << c->message;
}

// Byte ranges ld.so acts on, worth mutating: the ELF header, the program header table and the
// dynamic segment.
inline std::vector<std::pair<size_t, size_t>> loader_ranges(const Bytes& b) {
  Elf64_Ehdr eh = header(b);
  Elf64_Phdr d = get<Elf64_Phdr>(b, phdrs(b, PT_DYNAMIC).at(0));
  return {{0, sizeof(Elf64_Ehdr)},
          {eh.e_phoff, size_t{eh.e_phnum} * sizeof(Elf64_Phdr)},
          {d.p_offset, d.p_filesz}};
}

}  // namespace kh::test_elf
