#include "loader/elf_preflight.h"

#include <elf.h>

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "hub/base/fs.h"
#include "loader/elf_reader.h"

namespace kh {

namespace {

#if defined(__x86_64__)
constexpr uint16_t kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr uint16_t kHostMachine = EM_AARCH64;
#else
#error "kernel-hub's loader supports x86-64 and AArch64 hosts"
#endif

constexpr const char* kEntry = "kh_module_v1";

bool starts_with(const std::string& s, std::string_view p) {
  return s.rfind(p, 0) == 0;
}

// Why a library outside the allowlist is refused; the named families get a specific reason.
std::string refusal_reason(const std::string& lib) {
  if (starts_with(lib, "libcudart"))
    return "the CUDA runtime: host libraries must not link it (a cudart of another major breaks "
           "loading); ask the loader for device code with host->get_function and host->launch";
  if (starts_with(lib, "libcuda.so"))
    return "the CUDA driver: the loader owns it and loads it lazily";
  if (starts_with(lib, "libtorch") || starts_with(lib, "libc10"))
    return "PyTorch: kernel-hub packages run without PyTorch; take DLPack tensors instead";
  if (starts_with(lib, "libpython")) return "Python: host libraries must not embed Python";
  return "not in the allowlist (libc, libm, libdl, libpthread, librt, libstdc++, libgcc_s, the "
         "dynamic linker); link it statically or drop the dependency";
}

Check header_check(const elf::ElfInfo& info, const std::string& file) {
  if (info.type != ET_DYN)
    return {"elf-header", false,
            fmt::format("{}: refused by rule elf-header: e_type is {}, not ET_DYN (a shared "
                        "object); build the host library with -shared",
                        file, info.type)};
  if (info.machine != kHostMachine)
    return {"elf-header", false,
            fmt::format("{}: refused by rule elf-header: built for {}, but this host is {}; use "
                        "the package variant built for {}",
                        file, elf::machine_name(info.machine), elf::machine_name(kHostMachine),
                        elf::machine_name(kHostMachine))};
  return {"elf-header", true,
          fmt::format("ELF64 little-endian ET_DYN for {}", elf::machine_name(info.machine))};
}

Check needed_check(const elf::ElfInfo& info, const std::string& file) {
  std::vector<std::string> refused;
  for (const auto& lib : info.needed) {
    const auto& allow = needed_allowlist();
    if (std::find(allow.begin(), allow.end(), lib) == allow.end())
      refused.push_back(fmt::format("{} ({})", lib, refusal_reason(lib)));
  }
  if (!refused.empty())
    return {"needed-libraries", false,
            fmt::format("{}: refused by rule needed-libraries: it needs {}", file,
                        fmt::join(refused, "; "))};
  return {"needed-libraries", true,
          info.needed.empty() ? "needs no libraries"
                              : fmt::format("needs only {}", fmt::join(info.needed, ", "))};
}

Check rpath_check(const elf::ElfInfo& info, const std::string& file) {
  if (!info.rpath.empty() || !info.runpath.empty()) {
    std::vector<std::string> all = info.rpath;
    all.insert(all.end(), info.runpath.begin(), info.runpath.end());
    return {"no-rpath", false,
            fmt::format("{}: refused by rule no-rpath: it has DT_RPATH/DT_RUNPATH {}; library "
                        "search paths let a package pull in libraries the preflight never saw; "
                        "relink without -rpath (or strip it with patchelf --remove-rpath)",
                        file, fmt::join(all, ":"))};
  }
  return {"no-rpath", true, "no DT_RPATH or DT_RUNPATH"};
}

// DT_FILTER / DT_AUXILIARY make ld.so load another library in this one's place (a filtee),
// found on the search path: code the preflight never saw.
Check filters_check(const elf::ElfInfo& info, const std::string& file) {
  std::vector<std::string> found;
  for (const auto& f : info.filter) found.push_back("DT_FILTER " + f);
  for (const auto& a : info.auxiliary) found.push_back("DT_AUXILIARY " + a);
  if (!found.empty())
    return {"no-filters", false,
            fmt::format("{}: refused by rule no-filters: it has {}; a filter makes ld.so load "
                        "another library's symbols in place of this one's, from a library the "
                        "preflight never saw; relink without -Wl,--filter / -Wl,--auxiliary",
                        file, fmt::join(found, ", "))};
  return {"no-filters", true, "no DT_FILTER or DT_AUXILIARY"};
}

// DT_AUDIT / DT_DEPAUDIT name rtld-audit libraries: ld.so loads them and runs their code.
Check audit_check(const elf::ElfInfo& info, const std::string& file) {
  std::vector<std::string> found;
  for (const auto& a : info.audit) found.push_back("DT_AUDIT " + a);
  for (const auto& a : info.depaudit) found.push_back("DT_DEPAUDIT " + a);
  if (!found.empty())
    return {"no-audit", false,
            fmt::format("{}: refused by rule no-audit: it has {}; an audit library is loaded by "
                        "ld.so and watches every symbol binding of the process; relink without "
                        "-Wl,--audit / -Wl,--depaudit",
                        file, fmt::join(found, ", "))};
  return {"no-audit", true, "no DT_AUDIT or DT_DEPAUDIT"};
}

Check textrel_check(const elf::ElfInfo& info, const std::string& file) {
  if (info.textrel || info.flags_textrel) {
    std::string which = info.textrel && info.flags_textrel ? "DT_TEXTREL and DF_TEXTREL"
                        : info.textrel                     ? "DT_TEXTREL"
                                                           : "DF_TEXTREL in DT_FLAGS";
    return {"no-textrel", false,
            fmt::format("{}: refused by rule no-textrel: it has text relocations ({}); ld.so "
                        "would make its code pages writable to patch them; compile every object "
                        "with -fPIC (and link with -Wl,-z,text to find the one that is not)",
                        file, which)};
  }
  return {"no-textrel", true, "no text relocations"};
}

Check execstack_check(const elf::ElfInfo& info, const std::string& file) {
  if (!info.has_gnu_stack || info.exec_stack)
    return {"no-execstack", false,
            fmt::format("{}: refused by rule no-execstack: {}; dlopen would make the stack of "
                        "every thread in the process executable; link with -Wl,-z,noexecstack "
                        "(an assembly file without a .note.GNU-stack section is the usual cause)",
                        file,
                        info.has_gnu_stack
                            ? "it asks for an executable stack (PT_GNU_STACK with PF_X)"
                            : "it has no PT_GNU_STACK program header, which means an executable "
                              "stack")};
  return {"no-execstack", true, "non-executable stack (PT_GNU_STACK without PF_X)"};
}

// STB_GNU_UNIQUE symbols are bound process-wide even under RTLD_LOCAL: two versions of a package
// would share them, and the library can never be unloaded.
Check unique_check(const elf::ElfInfo& info, const std::string& file) {
  std::vector<std::string> unique;
  for (const auto& s : info.dynamic_symbols)
    if (s.defined && s.bind == STB_GNU_UNIQUE) unique.push_back(s.name);
  if (!unique.empty()) {
    size_t shown = std::min<size_t>(unique.size(), 5);
    return {"no-gnu-unique", false,
            fmt::format("{}: refused by rule no-gnu-unique: it defines {} STB_GNU_UNIQUE "
                        "symbol(s) ({}{}); ld.so binds them process-wide even under RTLD_LOCAL, "
                        "so two versions of a package would share them; compile with "
                        "-fno-gnu-unique (or -fvisibility=hidden)",
                        file, unique.size(),
                        fmt::join(std::vector(unique.begin(), unique.begin() + shown), ", "),
                        unique.size() > shown ? ", ..." : "")};
  }
  return {"no-gnu-unique", true, "no STB_GNU_UNIQUE symbols"};
}

Check versions_check(const elf::ElfInfo& info, const std::string& file, const HostVersions& host) {
  std::vector<std::string> problems;
  std::vector<std::string> checked;
  for (const auto& need : info.version_needs) {
    auto v = SymbolVersion::parse(need.version);
    bool relevant = starts_with(need.version, "GLIBC_") || starts_with(need.version, "GLIBCXX_") ||
                    starts_with(need.version, "CXXABI_");
    if (!relevant) continue;
    if (!v) {
      problems.push_back(
          fmt::format("{} from {} (not a public numbered version)", need.version, need.file));
      continue;
    }
    auto it = host.max.find(v->prefix);
    if (it == host.max.end()) {
      problems.push_back(
          fmt::format("{} from {} (this process has no library providing {} "
                      "versions loaded)",
                      need.version, need.file, v->prefix));
    } else if (it->second < *v) {
      problems.push_back(fmt::format("{} from {} (this host provides at most {})", need.version,
                                     need.file, it->second.str()));
    } else {
      checked.push_back(need.version);
    }
  }
  if (!problems.empty())
    return {"symbol-versions", false,
            fmt::format("{}: refused by rule symbol-versions: it needs {}; rebuild it with an "
                        "older toolchain (manylinux_2_28 class) or -static-libstdc++ "
                        "-static-libgcc",
                        file, fmt::join(problems, "; "))};
  std::sort(checked.begin(), checked.end());
  checked.erase(std::unique(checked.begin(), checked.end()), checked.end());
  return {"symbol-versions", true,
          checked.empty()
              ? "no GLIBC/GLIBCXX/CXXABI version needs"
              : fmt::format("needs {} (all provided by this host)", fmt::join(checked, ", "))};
}

Check entry_check(const elf::ElfInfo& info, const std::string& file) {
  auto it = std::find_if(info.dynamic_symbols.begin(), info.dynamic_symbols.end(),
                         [](const elf::DynamicSymbol& s) { return s.name == kEntry && s.defined; });
  std::string fix =
      "define it with KH_MODULE_ENTRY from kernel_hub_abi.h and export it with a version script "
      "{ global: kh_module_v1; local: *; }";
  if (it == info.dynamic_symbols.end())
    return {"entry-symbol", false,
            fmt::format("{}: refused by rule entry-symbol: it does not export {}; {}", file, kEntry,
                        fix)};
  if (it->bind != STB_GLOBAL || it->visibility != STV_DEFAULT || it->type != STT_FUNC)
    return {"entry-symbol", false,
            fmt::format("{}: refused by rule entry-symbol: {} must be a global function with "
                        "default visibility (bind {}, type {}, visibility {}); {}",
                        file, kEntry, it->bind, it->type, it->visibility, fix)};
  return {"entry-symbol", true, fmt::format("exports {} (global function)", kEntry)};
}

// Not a refusal: other exports are a warning (they can clash with the process's symbols).
Check exports_check(const elf::ElfInfo& info) {
  std::vector<std::string> others;
  for (const auto& s : info.dynamic_symbols) {
    bool exported = s.defined && (s.bind == STB_GLOBAL || s.bind == STB_WEAK) &&
                    s.visibility == STV_DEFAULT && s.type != STT_SECTION && s.type != STT_FILE;
    if (exported && s.name != kEntry && !s.name.empty()) others.push_back(s.name);
  }
  if (others.empty()) return {"exports", true, "exports only kh_module_v1"};
  size_t shown = std::min<size_t>(others.size(), 5);
  Check c{"exports", true,
          fmt::format("warning: also exports {} other symbol(s) ({}{}); export only kh_module_v1 "
                      "with a version script",
                      others.size(),
                      fmt::join(std::vector(others.begin(), others.begin() + shown), ", "),
                      others.size() > shown ? ", ..." : "")};
  c.warning = true;
  return c;
}

}  // namespace

bool PreflightReport::ok() const {
  return !checks.empty() &&
         std::all_of(checks.begin(), checks.end(), [](const Check& c) { return c.passed; });
}

std::string PreflightReport::failures() const {
  std::string out;
  for (const auto& c : checks) {
    if (c.passed) continue;
    if (!out.empty()) out += "\n";
    out += c.message;
  }
  return out;
}

const std::vector<std::string>& needed_allowlist() {
  static const std::vector<std::string> allow = {"libc.so.6",
                                                 "libm.so.6",
                                                 "libdl.so.2",
                                                 "libpthread.so.0",
                                                 "librt.so.1",
                                                 "libstdc++.so.6",
                                                 "libgcc_s.so.1",
                                                 "ld-linux-x86-64.so.2",
                                                 "ld-linux-aarch64.so.1"};
  return allow;
}

PreflightReport preflight_elf(std::span<const uint8_t> bytes, const std::string& file,
                              const HostVersions& host) {
  PreflightReport report{file, {}};
  elf::ElfInfo info;
  if (auto e = elf::parse_header(bytes, info)) {
    report.checks.push_back(
        {e->rule, false, fmt::format("{}: refused by rule {}: {}", file, e->rule, e->message)});
    return report;
  }
  report.checks.push_back(header_check(info, file));
  if (!report.checks.back().passed) return report;  // another machine: the rest is moot
  if (auto e = elf::parse(bytes, info)) {
    // What to do: such files come from tools that edit ELF files, or from tampering.
    std::string fix =
        e->rule == "dynamic-segment"
            ? "; what ld.so loads differs from what the section headers describe: rebuild the "
              "library with a standard linker and do not edit it afterwards"
            : "; the file is malformed or truncated: rebuild it";
    report.checks.push_back(
        {e->rule, false,
         fmt::format("{}: refused by rule {}: {}{}", file, e->rule, e->message, fix)});
    return report;
  }
  report.checks.push_back(needed_check(info, file));
  report.checks.push_back(rpath_check(info, file));
  report.checks.push_back(filters_check(info, file));
  report.checks.push_back(audit_check(info, file));
  report.checks.push_back(textrel_check(info, file));
  report.checks.push_back(execstack_check(info, file));
  report.checks.push_back(unique_check(info, file));
  report.checks.push_back(versions_check(info, file, host));
  report.checks.push_back(entry_check(info, file));
  report.checks.push_back(exports_check(info));
  return report;
}

PreflightReport preflight_file(const std::filesystem::path& path, const HostVersions& host) {
  std::string bytes;
  try {
    bytes = fs::read_file(path, 1ull << 30);
  } catch (const std::exception& e) {
    return {path.string(),
            {{"readable", false,
              fmt::format("{}: refused by rule readable: {}", path.string(), e.what())}}};
  }
  return preflight_elf(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                       path.string(), host);
}

}  // namespace kh
