// NVRTC for the kernel package tests, through dlopen("libnvrtc.so.13") with only the few
// prototypes used declared here (no CUDA headers), compiling a package's shipped .cu the way the
// loader does: no -I path, `--gpu-architecture=sm_XX -default-device --std=c++17`.
#pragma once

#include <dlfcn.h>

#include <string>
#include <type_traits>
#include <vector>

#include "hub/base/fs.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {

struct Nvrtc {
  typedef int Result;
  typedef struct Program* Prog;
  Result (*version)(int*, int*) = nullptr;
  Result (*create)(Prog*, const char*, const char*, int, const char* const*,
                   const char* const*) = nullptr;
  Result (*compile)(Prog, int, const char* const*) = nullptr;
  Result (*log_size)(Prog, size_t*) = nullptr;
  Result (*log)(Prog, char*) = nullptr;
  Result (*cubin_size)(Prog, size_t*) = nullptr;
  Result (*cubin)(Prog, char*) = nullptr;
  Result (*destroy)(Prog*) = nullptr;
  const char* (*error_string)(Result) = nullptr;
  std::string load_error;

  static const Nvrtc& get() {
    static Nvrtc n = load();
    return n;
  }
  bool ok() const { return load_error.empty(); }

  struct Output {
    bool ok = false;
    std::string log;
    std::string cubin;
  };
  Output compile_source(const std::string& src, const std::string& name,
                        const std::vector<std::string>& options) const {
    Output out;
    Prog p = nullptr;
    if (Result r = create(&p, src.c_str(), name.c_str(), 0, nullptr, nullptr); r != 0) {
      out.log = std::string("nvrtcCreateProgram: ") + error_string(r);
      return out;
    }
    std::vector<const char*> opts;
    for (auto& o : options) opts.push_back(o.c_str());
    Result r = compile(p, static_cast<int>(opts.size()), opts.data());
    size_t n = 0;
    log_size(p, &n);
    out.log.resize(n);
    if (n) log(p, out.log.data());
    while (!out.log.empty() && (out.log.back() == '\0' || out.log.back() == '\n'))
      out.log.pop_back();
    if (r == 0) {
      size_t cn = 0;
      cubin_size(p, &cn);
      out.cubin.resize(cn);
      cubin(p, out.cubin.data());
      out.ok = true;
    } else {
      out.log = std::string(error_string(r)) + "\n" + out.log;
    }
    destroy(&p);
    return out;
  }

 private:
  static Nvrtc load() {
    Nvrtc n;
    void* h = dlopen("libnvrtc.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("/usr/local/cuda/lib64/libnvrtc.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      n.load_error = std::string("libnvrtc.so.13 not found: ") + dlerror();
      return n;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn) n.load_error += std::string(name) + " missing; ";
    };
    sym(n.version, "nvrtcVersion");
    sym(n.create, "nvrtcCreateProgram");
    sym(n.compile, "nvrtcCompileProgram");
    sym(n.log_size, "nvrtcGetProgramLogSize");
    sym(n.log, "nvrtcGetProgramLog");
    sym(n.cubin_size, "nvrtcGetCUBINSize");
    sym(n.cubin, "nvrtcGetCUBIN");
    sym(n.destroy, "nvrtcDestroyProgram");
    sym(n.error_string, "nvrtcGetErrorString");
    return n;
  }
};

inline std::string shipped_source(const std::string& package) {
  return fs::read_file(package_dir(package) / (package + ".cu"), 16 << 20);
}

// Compiles the shipped <package>.cu for `sm` ("sm_90"); `verbose` adds ptxas -v to the log.
inline Nvrtc::Output compile_for(const std::string& package, const std::string& sm, bool verbose) {
  std::vector<std::string> opts = {"--gpu-architecture=" + sm, "-default-device", "--std=c++17"};
  if (verbose) opts.push_back("--ptxas-options=--verbose");
  return Nvrtc::get().compile_source(shipped_source(package), package + ".cu", opts);
}

}  // namespace kh::kernels_test
