// libFuzzer target for the ELF preflight: it parses untrusted package host libraries, so any
// byte string must yield a report, never a crash or an out-of-bounds read. Built with clang by
// tests/fuzz/run.sh (fuzz.elf_preflight in CTest); the GoogleTest test_loader_elf runs this same
// entry over a corpus of mutated ELF files so that CI exercises it with g++ too.
#include <cstddef>
#include <cstdint>
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
