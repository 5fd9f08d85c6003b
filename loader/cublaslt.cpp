#include "loader/cublaslt.h"

#include <memory>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "hub/base/dynamic_library.h"
#include "hub/base/error.h"
#include "hub/base/log.h"
#include "loader/cuda_library_names.h"

namespace kh::cublaslt {

namespace {

struct State {
  std::once_flag once;
  Api api;
  std::unique_ptr<Error> failure;
};

State& state() {
  static State* s = new State;  // never destroyed; the library is never unloaded
  return *s;
}

void load(State& s) {
  std::string tried;
  std::optional<DynamicLibrary> lib = DynamicLibrary::open_first(candidates(), tried);
  if (!lib)
    throw Error(ErrorKind::kNotFound,
                fmt::format("cuBLASLt not found, so the GEMM service cannot run on a CUDA device; "
                            "tried:{}\ninstall CUDA's cuBLAS (libcublasLt.so.13 or .so.12: the "
                            "CUDA toolkit, Debian/Ubuntu libcublaslt13 or libcublaslt12, or the "
                            "nvidia-cublas pip wheel) and, when it is not on the loader's path, "
                            "set KERNEL_HUB_CUBLASLT to its library or folder; or run on the cpu",
                            tried));
  Api& a = s.api;
  a.library = lib->name();
  std::string missing;
#define KH_CUBLASLT_FIND(ret, name, params) \
  if (!lib->find(#name, a.name)) missing += (missing.empty() ? "" : ", ") + std::string(#name);
  KH_CUBLASLT_FUNCTIONS(KH_CUBLASLT_FIND)
#undef KH_CUBLASLT_FIND
  if (!missing.empty())
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{} lacks {}: cuBLASLt older than CUDA 11; install cuBLAS 12 or 13",
                            a.library, missing));
  a.version = a.cublasLtGetVersion();
  log_line(kLogDebug, fmt::format("cuBLASLt {} loaded from {}", a.version, a.library));
}

}  // namespace

std::vector<std::string> candidates() {
  return cuda_library_candidates("KERNEL_HUB_CUBLASLT", "libcublasLt");
}

const Api& cublaslt() {
  State& s = state();
  load_once_or_throw(s.once, s.failure, "cuBLASLt", [&] { load(s); });
  return s.api;
}

std::string status_text(Status status) {
  State& s = state();
  if (!s.failure && s.api.cublasLtGetStatusString)
    if (const char* text = s.api.cublasLtGetStatusString(status)) return text;
  return fmt::format("cublasStatus_t {}", status);
}

}  // namespace kh::cublaslt
