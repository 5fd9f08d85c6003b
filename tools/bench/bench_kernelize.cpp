// Warm kernelize: a config with 8 layer types x 2 modes (eval, train) on the cpu device, every
// package already in the cache and the hub offline, bound into a fresh runtime each run. The
// toy package serves all 8 slots (its layer Scale, with a backward op, so train binds too).
// Measures the whole kernelize call: resolution over the cached indexes, the per-file digest
// check of the package, preflight/dlopen (once per process, then a lookup) and 16 binds.
//   build-dir/bench_kernelize [runs]        target: median <= 2 ms
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "hub/base/clock.h"
#include "hub/base/fs.h"
#include "registry/kernelize.h"
#include "registry/pack.h"

namespace {

using Clock = std::chrono::steady_clock;

struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("kh-bench-kernelize-" + kh::fs::random_hex(8));
  TempDir() { kh::fs::make_dirs(path); }
  ~TempDir() { kh::fs::remove_tree(path); }
};

}  // namespace

int main(int argc, char** argv) {
  int runs = argc > 1 ? std::atoi(argv[1]) : 200;
  try {
    TempDir tmp;
    auto hub_dir = tmp.path / "hub";
    kh::PackOptions p;
    p.package_dir = std::filesystem::path(KH_TOY_PACKAGES_DIR) / "toy-1.0.0";
    p.output = hub_dir;
    p.repo = "bench/toy";
    p.devices = {"cpu"};
    // Signed, and the key trusted: warm kernelize includes the signature check, as in use.
    const kh::trust::PrivateKey key = kh::trust::PrivateKey::generate();
    p.sign_key = &key;
    kh::trust::TrustStore keys;
    keys.add_builtin(key.public_key(), {"bench/*"});
    kh::pack_package(p);

    std::vector<std::string> layers;
    std::string config_json = "{";
    for (int i = 0; i < 8; ++i) {
      layers.push_back(fmt::format("Layer{}", i));
      config_json += fmt::format(
          "{}\"Layer{}\": {{\"cpu\": {{\"eval\": \"bench/toy@v1:Scale\", \"train\": "
          "\"bench/toy@v1:Scale\"}}}}",
          i ? ", " : "", i);
    }
    config_json += "}";
    kh::KernelConfig config = kh::KernelConfig::parse(config_json);
    kh::Device cpu = kh::local_cpu_device();

    kh::Store store(tmp.path / "cache");
    kh::HubAddress address = kh::HubAddress::parse(hub_dir.string(), false);
    auto fill = [](kh::Runtime& rt, const std::vector<std::string>& names) {
      for (auto& n : names) rt.add_slot(n, {});
    };
    kh::KernelizeOptions options;
    options.trust_keys = &keys;
    options.local = std::map<std::string, std::filesystem::path>{};
    options.disable = false;
    {  // Online once: fetch and record the ref.
      kh::HubOptions o;
      o.progress = false;
      kh::Hub hub(address, store, o);
      kh::Runtime rt;
      fill(rt, layers);
      auto r = kh::kernelize(rt, config, hub, cpu, options);
      fmt::print("cold kernelize (fetch from a layout hub): {:.3f} ms, {} variant fetched\n",
                 r.total_ms, r.fetched);
    }
    kh::HubOptions offline;
    offline.offline = true;
    offline.progress = false;
    kh::Hub hub(address, store, offline);
    std::vector<double> ms;
    for (int i = 0; i < runs; ++i) {
      kh::Runtime rt;
      fill(rt, layers);
      auto t0 = Clock::now();
      auto r = kh::kernelize(rt, config, hub, cpu, options);
      ms.push_back(kh::ms_since(t0));
      if (r.fetched != 0 || r.bindings.size() != 16 ||
          r.find("Layer7", kh::Mode::kTrain)->source != kh::BindingSource::kCache) {
        fmt::print(stderr, "unexpected kernelize result:\n{}", r.str());
        return 1;
      }
    }
    std::sort(ms.begin(), ms.end());
    fmt::print(
        "warm kernelize, 8 layer types x 2 modes, cpu, offline: median {:.3f} ms, p90 {:.3f} ms, "
        "min {:.3f} ms over {} runs (target <= 2 ms)\n",
        ms[ms.size() / 2], ms[ms.size() * 9 / 10], ms.front(), ms.size());
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_kernelize: {}\n", e.what());
    return 1;
  }
}
