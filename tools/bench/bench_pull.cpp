// Pull benchmark (not a test): a 256 MiB set of blobs from a loopback docker-registry,
// kernel-hub against curl fetching the same blobs in the same run; and a warm offline pull of
// a cached ref, as a process and in-process. Prints a markdown table.
// Usage: bench_pull [--mib N] [--runs N] [--hold]
// --hold: push the set, print the hub address, and wait for a line on stdin before measuring
// (to profile `kernel-hub pull` by hand against the same registry).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "hub/hub.h"
#include "tests/fixtures/layout_builder.h"
#include "tests/fixtures/process.h"
#include "tests/fixtures/registry_fixture.h"

using namespace kh;
using namespace kh::test;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

void must(const ProcessResult& r, const char* what) {
  if (r.exit_code != 0) {
    std::fprintf(stderr, "%s failed (%d): %s\n", what, r.exit_code, r.err.c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int total_mib = 256, runs = 3;
  bool hold = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--hold")) hold = true;
    if (i + 1 >= argc) continue;
    if (!std::strcmp(argv[i], "--mib"))
      total_mib = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--runs"))
      runs = std::atoi(argv[++i]);
  }
  RegistryFixture registry;
  if (!registry.available()) {
    std::fprintf(stderr, "docker-registry unavailable: %s\n", registry.why().c_str());
    return 1;
  }
  TempDir work("kh-bench-pull");
  LayoutSpec spec;
  spec.variants = 16;
  spec.layer_bytes = static_cast<uint64_t>(total_mib) * (1 << 20) / 16;
  BuiltLayout built = build_layout(work / "layout", spec);
  const double mib = static_cast<double>(built.layer_bytes) / (1 << 20);
  must(run_process({cli_path(), "--cache", (work / "push-cache").string(), "--plain-http", "--hub",
                    registry.oci_url(), "-q", "push", (work / "layout").string(), "bench/set@v1"}),
       "push");
  if (hold) {
    std::printf("hub: %s  ref: bench/set@v1  (press Enter to measure)\n",
                registry.oci_url().c_str());
    std::fflush(stdout);
    std::getchar();
  }

  std::vector<double> ours, curl;
  for (int r = 0; r < runs; ++r) {
    // curl: the same blob URLs, 8 transfers in parallel, written to files.
    auto dir = work / ("curl" + std::to_string(r));
    std::filesystem::create_directories(dir);
    std::vector<std::string> args = {"curl", "-sS", "--fail", "--parallel", "--parallel-max", "8"};
    for (auto& l : built.layers) {
      args.insert(args.end(), {"-o", (dir / l.digest.hex).string(),
                               registry.http_url() + "/v2/bench/set/blobs/" + l.digest.str()});
    }
    auto t0 = Clock::now();
    must(run_process(args), "curl");
    curl.push_back(seconds_since(t0));
    std::filesystem::remove_all(dir);

    auto cache = work / ("cache" + std::to_string(r));
    t0 = Clock::now();
    must(run_process({cli_path(), "--cache", cache.string(), "--plain-http", "--hub",
                      registry.oci_url(), "-q", "pull", "bench/set@v1"}),
         "kernel-hub pull");
    ours.push_back(seconds_since(t0));
    if (r + 1 < runs) remove_tree(cache);
  }

  // Warm offline pull of the cached ref: whole process, and the library call alone.
  auto warm_cache = work / ("cache" + std::to_string(runs - 1));
  std::vector<double> proc_ms, lib_ms;
  for (int i = 0; i < 20; ++i) {
    auto t0 = Clock::now();
    must(run_process({cli_path(), "--cache", warm_cache.string(), "--hub", registry.oci_url(),
                      "--plain-http", "--offline", "-q", "pull", "bench/set@v1"}),
         "offline pull");
    proc_ms.push_back(seconds_since(t0) * 1e3);
  }
  {
    Store store(warm_cache);
    HubOptions o;
    o.offline = true;
    o.progress = false;
    Hub hub(HubAddress::parse(registry.oci_url(), true), store, o);
    Ref ref = Ref::parse("bench/set@v1");
    for (int i = 0; i < 200; ++i) {
      auto t0 = Clock::now();
      hub.pull(ref);
      lib_ms.push_back(seconds_since(t0) * 1e3);
    }
  }

  double ours_s = median(ours), curl_s = median(curl);
  std::printf("| measurement | kernel-hub | baseline (same run) | ratio | target |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");
  std::printf(
      "| pull %.0f MiB (16 blobs) from loopback docker-registry, MiB/s | %.0f | curl "
      "--parallel: %.0f | %.2fx | >= 0.8x |\n",
      mib, mib / ours_s, mib / curl_s, curl_s / ours_s);
  std::printf(
      "| warm offline `pull` of a cached ref, whole process, ms | %.2f | - | - | <= 5 ms |\n",
      median(proc_ms));
  std::printf("| warm offline pull, library call (`Hub::pull`), ms | %.3f | - | - | <= 5 ms |\n",
              median(lib_ms));
  std::printf(
      "\nmedian of %d runs each; kernel-hub times include process start, sha256 "
      "verification and fsync of every blob; curl writes without verifying.\n",
      runs);
  return 0;
}
