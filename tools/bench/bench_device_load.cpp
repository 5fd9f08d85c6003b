// Device-code load benchmarks: warm load of a package's device code from the JIT cache (read +
// verify the entry, cuLibraryLoadData, cuLibraryGetKernel; target <= 1 ms), the same plus the
// first cuKernelGetFunction (where lazy loading moves the module load), dlopen of the host
// library (raw, and through the loader's preflight + table validation), and a cold NVRTC
// compile of the package's CUDA source (target <= 300 ms). Without a GPU the driver figures are
// reported as n/a. Prints a table with figure, median, target, ratio (median / target).
//   build-dir/bench_device_load [package_dir] [repeats]
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "hub/base/clock.h"
#include "hub/base/digest.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "loader/cuda_arch.h"
#include "loader/cuda_driver.h"
#include "loader/jit_cache.h"
#include "loader/module.h"
#include "loader/nvrtc.h"
#include "loader/package_dir.h"

namespace {

namespace stdfs = std::filesystem;
using Clock = std::chrono::steady_clock;
using kh::ms_since;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Row {
  std::string figure;
  double value_ms = -1;  // < 0: n/a
  double target_ms = 0;  // 0: report only
  std::string note;
};

std::string fmt_ms(double ms) {
  if (ms < 0) return "n/a";
  if (ms < 1) return fmt::format("{:.1f} us", ms * 1000);
  return fmt::format("{:.2f} ms", ms);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kh;
  stdfs::path package_dir =
      argc > 1 ? stdfs::path(argv[1]) : stdfs::path(KH_TOY_PACKAGES_DIR) / "toy-source-only";
  const int repeats = argc > 2 ? std::max(3, std::atoi(argv[2])) : 200;
  std::vector<Row> rows;
  try {
    PackageDir pkg = read_package_dir(package_dir);
    if (pkg.cuda_source.empty()) {
      fmt::print(stderr, "{} has no cuda_source; pass a package with one\n", package_dir.string());
      return 2;
    }
    const std::string source = fs::read_file(pkg.cuda_source);

    // The GPU (if any) decides the target; else sm_90, the H200's.
    CudaArch target{9, 0, 0};
    std::string gpu = "none";
    bool have_gpu = false;
    double driver_init_ms = -1;
    try {
      auto t0 = Clock::now();
      const cuda::DeviceInfo& dev = cuda::device(0);  // dlopen + cuInit + primary context
      driver_init_ms = ms_since(t0);
      target = {dev.sm_major, dev.sm_minor, 0};
      gpu = fmt::format("{} ({}), driver CUDA {}", dev.name, target.sm(),
                        cuda::cuda_driver().driver_version);
      have_gpu = true;
    } catch (const Error& e) {
      gpu = fmt::format("none ({})", e.what());
    }

    // Cold NVRTC compiles (--no-cache: every compile is a real one).
    auto t_nvrtc = Clock::now();
    const NvrtcInfo& compiler = nvrtc();
    const double nvrtc_load_ms = ms_since(t_nvrtc);
    const auto options = nvrtc_options(target, compiler.version);
    std::vector<double> compiles;
    std::string cubin;
    for (int i = 0; i < 7; ++i) {
      auto t0 = Clock::now();
      cubin = nvrtc_compile_cubin(source, pkg.cuda_source.filename().string(), options,
                                  pkg.cuda_source.string());
      compiles.push_back(ms_since(t0));
    }

    // The JIT cache entry, in a fresh temp directory.
    stdfs::path tmp = stdfs::temp_directory_path() / ("kh-bench-device-" + fs::random_hex(8));
    JitCache cache(tmp / "jit");
    JitKeyInput in;
    in.abi_major = KH_ABI_MAJOR;
    in.source = source;
    in.options = options;
    in.nvrtc_major = compiler.version.major;
    in.nvrtc_minor = compiler.version.minor;
    in.target = target.sm();
    const Digest key = jit_cache_key(in);
    cache.store(key, cubin);
    std::vector<double> hits;
    for (int i = 0; i < repeats; ++i) {
      auto t0 = Clock::now();
      auto hit = cache.lookup(key);
      hits.push_back(ms_since(t0));
      if (!hit) throw Error(ErrorKind::kIntegrity, "benchmark: JIT cache entry missing");
    }

    // Warm load on the GPU: hit + cuLibraryLoadData + cuLibraryGetKernel (each iteration loads
    // a new library, as a new process would; never unloaded, as in the loader).
    std::vector<double> warm, warm_fn;
    if (have_gpu) {
      const cuda::Driver& d = cuda::cuda_driver();
      cuda::ScopedContext scope(cuda::device(0).primary_context);
      std::vector<std::string*> images;  // kept alive: loaded with BINARY_IS_PRESERVED
      for (int i = 0; i < repeats; ++i) {
        auto t0 = Clock::now();
        auto* image = new std::string(*cache.lookup(key));
        images.push_back(image);
        cuda::CUlibrary lib = nullptr;
        cuda::CUlibraryOption opt = cuda::CU_LIBRARY_BINARY_IS_PRESERVED;
        void* val = reinterpret_cast<void*>(uintptr_t{1});
        cuda::check(d.cuLibraryLoadData(&lib, image->data(), nullptr, nullptr, 0, &opt, &val, 1),
                    "cuLibraryLoadData");
        cuda::CUkernel kernel = nullptr;
        cuda::check(d.cuLibraryGetKernel(&kernel, lib, "toy_scale_f32"), "cuLibraryGetKernel");
        warm.push_back(ms_since(t0));
        cuda::CUfunction fn = nullptr;
        cuda::check(d.cuKernelGetFunction(&fn, kernel), "cuKernelGetFunction");
        warm_fn.push_back(ms_since(t0));
      }
    }

    // dlopen of the host library: copies at distinct paths, so each is a real load.
    const int dl_runs = std::min(repeats, 50);
    std::vector<double> dl_raw, dl_loader;
    for (int i = 0; i < dl_runs; ++i) {
      stdfs::path dir = tmp / fmt::format("raw{}", i);
      stdfs::create_directories(dir);
      stdfs::copy_file(pkg.host_library, dir / "libtoy.so");
      auto t0 = Clock::now();
      void* h = dlopen((dir / "libtoy.so").c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
      if (!h || !dlsym(h, "kh_module_v1")) throw Error(ErrorKind::kIo, "benchmark: dlopen failed");
      dl_raw.push_back(ms_since(t0));
    }
    for (int i = 0; i < dl_runs; ++i) {
      stdfs::path dir = tmp / fmt::format("pkg{}", i);
      stdfs::create_directories(dir);
      stdfs::copy_file(pkg.host_library, dir / "libtoy.so");
      auto t0 = Clock::now();
      const LoadedModule& m = load_module(dir / "libtoy.so");
      dl_loader.push_back(ms_since(t0));
      if (m.view.layers.empty()) throw Error(ErrorKind::kIo, "benchmark: empty module");
    }
    stdfs::remove_all(tmp);

    rows.push_back(
        {"driver init: dlopen libcuda + cuInit + primary ctx (once)", driver_init_ms, 0, "report"});
    rows.push_back({"NVRTC dlopen + nvrtcVersion (once)", nvrtc_load_ms, 0, "report"});
    rows.push_back({fmt::format("cold NVRTC compile of {} for {} (first)",
                                pkg.cuda_source.filename().string(), target.sm()),
                    compiles.front(), 300, ""});
    rows.push_back({"cold NVRTC compile (median of 7)", median(compiles), 300, ""});
    rows.push_back({"JIT cache hit: read + verify entry", median(hits), 0, "report"});
    rows.push_back({"warm load: JIT hit + cuLibraryLoadData + cuLibraryGetKernel",
                    have_gpu ? median(warm) : -1, 1, ""});
    rows.push_back({"  same + first cuKernelGetFunction (lazy module load)",
                    have_gpu ? median(warm_fn) : -1, 1, ""});
    rows.push_back(
        {"dlopen host library (RTLD_NOW|LOCAL|NODELETE) + dlsym", median(dl_raw), 1, ""});
    rows.push_back({"loader: preflight + dlopen + module table", median(dl_loader), 1, ""});

    fmt::print("bench_device_load: package {}\n", package_dir.string());
    fmt::print("GPU: {}\nNVRTC {} ({}), cubin {} bytes, options:", gpu, compiler.version.str(),
               compiler.library, cubin.size());
    for (const auto& o : options) fmt::print(" {}", o);
    fmt::print("\nrepeats: {} (dlopen: {})\n\n", repeats, dl_runs);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_device_load: {}\n", e.what());
    return 1;
  }
  fmt::print("| {:<62} | {:>10} | {:>10} | {:>6} |\n", "figure", "median", "target", "ratio");
  fmt::print("|{:-<64}|{:->12}|{:->12}|{:->8}|\n", "", "", "", "");
  for (const auto& r : rows) {
    std::string target = r.target_ms > 0 ? fmt_ms(r.target_ms) : "-";
    std::string ratio = (r.target_ms > 0 && r.value_ms >= 0)
                            ? fmt::format("{:.2f}", r.value_ms / r.target_ms)
                            : "-";
    fmt::print("| {:<62} | {:>10} | {:>10} | {:>6} |\n", r.figure, fmt_ms(r.value_ms), target,
               ratio);
  }
  return 0;
}
