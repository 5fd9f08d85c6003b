#include "loader/nvrtc.h"

#include <algorithm>
#include <clocale>
#include <memory>
#include <mutex>
#include <optional>
#include <semaphore>

#include <fmt/format.h>

#include "hub/base/dynamic_library.h"
#include "hub/base/error.h"
#include "hub/base/log.h"
#include "loader/cuda_library_names.h"

namespace kh {

namespace {

// Declarations mirroring nvrtc.h (CUDA 13.0).
using nvrtcResult = int;
struct _nvrtcProgram;
using nvrtcProgram = _nvrtcProgram*;
constexpr nvrtcResult NVRTC_SUCCESS = 0;
constexpr nvrtcResult NVRTC_ERROR_COMPILATION = 6;

// clang-format off
// The NVRTC functions the loader calls, each named once: X(return type, name, (parameters)).
// Required: NVRTC 11.1 (cubin output) has them all.
#define KH_NVRTC_REQUIRED(X)                                                 \
  X(nvrtcResult, nvrtcVersion, (int* major, int* minor))                     \
  X(const char*, nvrtcGetErrorString, (nvrtcResult result))                  \
  X(nvrtcResult, nvrtcCreateProgram,                                         \
    (nvrtcProgram* prog, const char* src, const char* name, int num_headers, \
     const char* const* headers, const char* const* include_names))          \
  X(nvrtcResult, nvrtcDestroyProgram, (nvrtcProgram* prog))                  \
  X(nvrtcResult, nvrtcCompileProgram,                                        \
    (nvrtcProgram prog, int num_options, const char* const* options))        \
  X(nvrtcResult, nvrtcGetProgramLogSize, (nvrtcProgram prog, size_t* size))  \
  X(nvrtcResult, nvrtcGetProgramLog, (nvrtcProgram prog, char* log))         \
  X(nvrtcResult, nvrtcGetCUBINSize, (nvrtcProgram prog, size_t* size))       \
  X(nvrtcResult, nvrtcGetCUBIN, (nvrtcProgram prog, char* cubin))
// Optional: null when missing (the supported-architecture list is then unknown).
#define KH_NVRTC_OPTIONAL(X)                              \
  X(nvrtcResult, nvrtcGetNumSupportedArchs, (int* count)) \
  X(nvrtcResult, nvrtcGetSupportedArchs, (int* archs))
// clang-format on

struct Api {
#define KH_NVRTC_FIELD(ret, name, params) ret(*name) params = nullptr;
  KH_NVRTC_REQUIRED(KH_NVRTC_FIELD)
  KH_NVRTC_OPTIONAL(KH_NVRTC_FIELD)
#undef KH_NVRTC_FIELD
};

struct State {
  std::once_flag once;
  Api api;
  NvrtcInfo info;
  std::unique_ptr<Error> failure;
};

State& state() {
  static State* s = new State;  // never destroyed; the library is never unloaded
  return *s;
}

std::vector<std::string> candidates() {
  return cuda_library_candidates("KERNEL_HUB_NVRTC", "libnvrtc");
}

void load(State& s) {
  std::string tried;
  std::optional<DynamicLibrary> lib = DynamicLibrary::open_first(candidates(), tried);
  if (!lib)
    throw Error(ErrorKind::kNotFound,
                fmt::format("NVRTC not found, so a package's CUDA source cannot be compiled; "
                            "tried:{}\ninstall the CUDA toolkit's NVRTC (libnvrtc.so.13) or the "
                            "nvidia-cuda-nvrtc wheel and set KERNEL_HUB_NVRTC to its library or "
                            "folder, or use a package with a cubin for this GPU",
                            tried));
  s.info.library = lib->name();
  Api& a = s.api;
  std::vector<std::string> missing;
#define KH_NVRTC_REQUIRE(ret, name, params) \
  if (!lib->find(#name, a.name)) missing.push_back(#name);
#define KH_NVRTC_FIND(ret, name, params) lib->find(#name, a.name);
  KH_NVRTC_REQUIRED(KH_NVRTC_REQUIRE)
  KH_NVRTC_OPTIONAL(KH_NVRTC_FIND)
#undef KH_NVRTC_REQUIRE
#undef KH_NVRTC_FIND
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{} lacks {}: NVRTC older than CUDA 11.1 (no cubin output); install "
                            "NVRTC 12 or 13",
                            s.info.library, list));
  }
  if (a.nvrtcVersion(&s.info.version.major, &s.info.version.minor) != NVRTC_SUCCESS)
    throw Error(ErrorKind::kIo, fmt::format("{}: nvrtcVersion failed", s.info.library));
  int count = 0;
  if (a.nvrtcGetNumSupportedArchs && a.nvrtcGetSupportedArchs &&
      a.nvrtcGetNumSupportedArchs(&count) == NVRTC_SUCCESS && count > 0 && count < 1024) {
    s.info.archs.resize(static_cast<size_t>(count));
    if (a.nvrtcGetSupportedArchs(s.info.archs.data()) != NVRTC_SUCCESS) s.info.archs.clear();
  }
  log_line(kLogDebug, fmt::format("NVRTC {} loaded from {}", s.info.version.str(), s.info.library));
}

std::string result_text(const Api& a, nvrtcResult r) {
  const char* text = a.nvrtcGetErrorString ? a.nvrtcGetErrorString(r) : nullptr;
  return text ? fmt::format("{} ({})", text, r) : fmt::format("nvrtcResult {}", r);
}

// Each compile holds a few hundred MB: at most 8 at once per process.
std::counting_semaphore<8>& compile_slots() {
  static auto* s = new std::counting_semaphore<8>(8);
  return *s;
}

// NVRTC before 12.6.2 changed the process locale during a compile: save and restore it.
class LocaleGuard {
 public:
  explicit LocaleGuard(bool active) {
    if (!active) return;
    const char* current = std::setlocale(LC_ALL, nullptr);
    if (current) saved_ = current;
  }
  ~LocaleGuard() {
    if (!saved_.empty()) std::setlocale(LC_ALL, saved_.c_str());
  }

 private:
  std::string saved_;
};

}  // namespace

const NvrtcInfo& nvrtc() {
  State& s = state();
  load_once_or_throw(s.once, s.failure, "NVRTC", [&] { load(s); });
  return s.info;
}

std::vector<std::string> nvrtc_options(const CudaArch& arch, const NvrtcVersion& version) {
  std::vector<std::string> o = {
      "--gpu-architecture=" + arch.sm(),
      "--std=c++17",
      "-default-device",
  };
  // Without it NVRTC raises the process-wide stack rlimit during each compile.
  if (version.at_least(12, 4)) o.push_back("--modify-stack-limit=false");
  // NVRTC >= 12.9 has its own cache (in the driver's compute cache): ours must be the only one.
  if (version.at_least(12, 9)) o.push_back("--no-cache");
  std::sort(o.begin(), o.end());
  return o;
}

std::string nvrtc_compile_cubin(std::string_view source, const std::string& file_name,
                                const std::vector<std::string>& options,
                                const std::string& display_path) {
  const NvrtcInfo& info = nvrtc();
  const Api& a = state().api;
  std::string target = "the requested target";
  for (const auto& o : options)
    if (o.starts_with("--gpu-architecture=")) target = o.substr(19);
  if (auto arch = CudaArch::parse(target);
      arch && !info.archs.empty() &&
      std::find(info.archs.begin(), info.archs.end(), arch->major * 10 + arch->minor) ==
          info.archs.end()) {
    std::string have;
    for (int x : info.archs) have += (have.empty() ? "sm_" : ", sm_") + std::to_string(x);
    throw Error(ErrorKind::kUnsupported,
                fmt::format("NVRTC {} ({}) cannot compile {} for {}: it supports {}; install an "
                            "NVRTC that supports this GPU or use a package with a cubin for it",
                            info.version.str(), info.library, display_path, target, have));
  }

  compile_slots().acquire();
  struct Release {
    ~Release() { compile_slots().release(); }
  } release;
  LocaleGuard locale(!info.version.at_least(12, 7));

  std::string src(source);  // NUL-terminated copy
  nvrtcProgram prog = nullptr;
  nvrtcResult r = a.nvrtcCreateProgram(&prog, src.c_str(), file_name.c_str(), 0, nullptr, nullptr);
  if (r != NVRTC_SUCCESS)
    throw Error(ErrorKind::kIo, fmt::format("nvrtcCreateProgram for {} failed: {}", display_path,
                                            result_text(a, r)));
  struct Destroy {
    const Api& a;
    nvrtcProgram& p;
    ~Destroy() { a.nvrtcDestroyProgram(&p); }
  } destroy{a, prog};

  std::vector<const char*> argv;
  for (const auto& o : options) argv.push_back(o.c_str());
  r = a.nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  std::string log;
  size_t log_size = 0;
  if (a.nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    log.resize(log_size);
    if (a.nvrtcGetProgramLog(prog, log.data()) != NVRTC_SUCCESS) log.clear();
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  }
  std::string opts;
  for (const auto& o : options) opts += (opts.empty() ? "" : " ") + o;
  if (r != NVRTC_SUCCESS) {
    throw Error(r == NVRTC_ERROR_COMPILATION ? ErrorKind::kInvalidInput : ErrorKind::kIo,
                fmt::format("NVRTC {} could not compile {} for {} ({}; options: {}):\n{}\nfix the "
                            "package's CUDA source or use a package with a cubin for this GPU",
                            info.version.str(), display_path, target, result_text(a, r), opts,
                            log.empty() ? "(no compile log)" : log));
  }
  if (!log.empty())
    log_line(kLogDebug, fmt::format("NVRTC warnings for {}:\n{}", display_path, log));
  size_t size = 0;
  r = a.nvrtcGetCUBINSize(prog, &size);
  if (r != NVRTC_SUCCESS || size == 0)
    throw Error(ErrorKind::kIo,
                fmt::format("NVRTC compiled {} but produced no cubin ({}); the target {} must be a "
                            "real architecture (sm_XY), not a virtual one",
                            display_path, result_text(a, r), target));
  std::string cubin(size, '\0');
  r = a.nvrtcGetCUBIN(prog, cubin.data());
  if (r != NVRTC_SUCCESS)
    throw Error(ErrorKind::kIo,
                fmt::format("nvrtcGetCUBIN for {} failed: {}", display_path, result_text(a, r)));
  return cubin;
}

}  // namespace kh
