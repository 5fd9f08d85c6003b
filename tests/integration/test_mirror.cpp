// Offline mirrors (hub/mirror/mirror.h, `kernel-hub export` / `import`), end to end:
// - the signed toy package (a cuda and a cpu variant) pushed to a real docker-registry, exported
//   for cpu by the CLI from cache A; the registry stopped; `KERNEL_HUB_OFFLINE=1 import` into an
//   empty cache B; kernelize offline against the ORIGINAL registry address from cache B (every
//   slot bound from the cache, also under a lock made on the registry, and refused with other
//   trust keys); the mirror served with --hub DIR (full signed index, only the cpu blobs);
// - a mirror with one blob byte changed is refused at import, naming the blob, recording nothing;
// - export refuses a non-empty directory and replaces only a mirror with --force;
// - the demo: its config exported from the embedded default hub, imported offline into an empty
//   cache, `demo --device cpu --steps 30 --json` offline binds every slot from the cache and
//   learns; and from `--hub DIR` with an empty cache.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/mirror/mirror.h"
#include "registry/kernelize.h"
#include "registry/lock_file.h"
#include "tests/fixtures/process.h"
#include "tests/fixtures/registry_fixture.h"
#include "tests/unit/test_kernelize_util.h"

namespace kh::test {
namespace {

using json = nlohmann::json;

// The CLI's environment: nothing from the caller's shell leaks in.
Env clean_env(Env env = {}) {
  env.emplace("KERNEL_HUB_BACKOFF_S", "0.05");
  for (const char* name : {"KERNEL_HUB_OFFLINE", "KERNEL_HUB_ENDPOINT", "KERNEL_HUB_LOCAL",
                           "KERNEL_HUB_DISABLE", "KERNEL_HUB_ALLOW_UNSIGNED", "KERNEL_HUB_CACHE"})
    env.emplace(name, "\x01");
  return env;
}

std::string read_text(const std::filesystem::path& p) {
  return fs::read_file(p);
}

class MirrorE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!registry_.available()) GTEST_SKIP() << registry_.why();
    // The toy with a cuda (source only) and a cpu variant: a cpu mirror is a partial index.
    PackOptions o;
    o.package_dir = toy_package("toy-1.0.0");
    o.output = layout_.path();
    o.devices = {"cuda", "cpu"};
    o.sms = {};
    o.cuda_version = "12.0";
    o.tags = {"v1"};
    sign_as_test_publisher(o, "test/toy");
    PackReport r = pack_package(o);
    index_ = r.index.digest;
    ASSERT_EQ(r.variants.size(), 2u);
    for (auto& v : r.variants) (v.device == "cpu" ? cpu_ : cuda_) = v;
    Store push_store(push_cache_.path());
    hub(push_store)->push(layout_.path(), Ref::parse("test/toy@v1"));
    fs::write_file_atomic(config_path_, toy_config("test/toy"));
  }

  HubAddress registry_address() const { return HubAddress::parse(registry_.oci_url(), true); }

  std::unique_ptr<Hub> hub(Store& store, bool offline = false) {
    HubOptions o;
    o.progress = false;
    o.offline = offline;
    o.source.http.allow_plain_http = true;
    return std::make_unique<Hub>(registry_address(), store, o);
  }
  std::unique_ptr<Hub> dir_hub(Store& store, const std::filesystem::path& dir, bool offline) {
    HubOptions o;
    o.progress = false;
    o.offline = offline;
    return std::make_unique<Hub>(HubAddress::parse(dir.string(), false), store, o);
  }

  ProcessResult cli(const std::vector<std::string>& args, const std::filesystem::path& cache,
                    Env env = {}) {
    std::vector<std::string> argv = {cli_path(),     "--cache", cache.string(),
                                     "--plain-http", "--hub",   registry_.oci_url()};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_process(argv, clean_env(std::move(env)), 120);
  }
  // import runs with the network off, as on the air-gapped machine.
  ProcessResult import_offline(const std::filesystem::path& dir,
                               const std::filesystem::path& cache) {
    return run_process({cli_path(), "--cache", cache.string(), "import", dir.string(), "--json"},
                       clean_env({{"KERNEL_HUB_OFFLINE", "1"}}), 120);
  }

  // cache A: pulls and exports the config for this machine's cpu.
  json export_cpu(const std::filesystem::path& cache, const std::filesystem::path& dir,
                  std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"export", "--config", config_path_.string(), "--device",
                                     "cpu",    "-o",       dir.string(),          "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    ProcessResult r = cli(args, cache);
    EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
    if (r.exit_code != 0) return {};
    return json::parse(r.out);
  }

  void expect_bound_from(const KernelizeReport& r, BindingSource source) {
    SCOPED_TRACE(r.str());
    for (Mode m : {Mode::kEval, Mode::kTrain}) {
      const KernelizeBinding* b = r.find("Scale", m);
      ASSERT_NE(b, nullptr);
      EXPECT_EQ(b->source, source) << mode_name(m);
      EXPECT_EQ(b->package, "toy@1.0.0");
      EXPECT_EQ(b->index_digest, index_);
      ASSERT_TRUE(b->variant_digest.has_value());
      EXPECT_EQ(*b->variant_digest, cpu_.entry.digest);
      EXPECT_NE(b->trust.find("signed by"), std::string::npos) << b->trust;
    }
    EXPECT_EQ(r.find("ScaleInfer", Mode::kEval)->source, source);
  }

  static void expect_scale_works(Runtime& rt) {
    Vec x({1, -2, 4}), y({0, 0, 0});
    rt.set_mode(Mode::kTrain);
    ASSERT_EQ(call_scale(rt, "Scale", x, 3, y), KH_OK);
    EXPECT_EQ(y.data, (std::vector<float>{3, -6, 12}));
    rt.set_mode(Mode::kEval);
    ASSERT_EQ(call_scale(rt, "ScaleInfer", x, 2, y), KH_OK);
    EXPECT_EQ(y.data, (std::vector<float>{2, -4, 8}));
  }

  RegistryFixture registry_;
  TempDir push_cache_{"kh-push-cache"};
  TempDir layout_{"kh-layout"};
  TempDir work_{"kh-mirror"};
  std::filesystem::path config_path_ = work_ / "kernels.json";
  KernelConfig config_ = KernelConfig::parse(toy_config("test/toy"));
  Digest index_;
  PackedVariant cpu_, cuda_;
};

TEST_F(MirrorE2E, ExportStopImportOfflineKernelizeAgainstTheOriginalHub) {
  const auto cache_a = work_ / "cache-a", cache_b = work_ / "cache-b";
  const auto dir = work_ / "mirror";
  // A lock made on the registry, before it goes away.
  LockFile lock;
  {
    Store store(cache_a);
    auto h = hub(store);
    KernelizeIndexProvider provider(*h);
    LockBuild built = build_lock(config_, {local_cpu_device()}, provider);
    ASSERT_TRUE(built.misses.empty()) << built.misses.front();
    lock = built.lock;
    // cache A has the package (kernelize pulled it).
    Runtime rt;
    add_slots(rt, {"Scale"});
    kernelize(rt, config_, *h, local_cpu_device(), {});
  }

  json ex = export_cpu(cache_a, dir);
  ASSERT_FALSE(ex.is_null());
  EXPECT_EQ(ex["source_hub_id"], registry_address().id());
  ASSERT_EQ(ex["refs"].size(), 1u) << ex.dump(2);
  EXPECT_EQ(ex["refs"][0]["ref"], "test/toy@v1");
  EXPECT_EQ(ex["refs"][0]["index_digest"], index_.str());
  EXPECT_EQ(ex["refs"][0]["variants_total"], 2);
  EXPECT_EQ(ex["refs"][0]["variants_exported"], 1);
  EXPECT_GE(ex["refs"][0]["signatures"].get<int>(), 1);

  // The layout: the signed index byte for byte, both variant manifests, only the cpu blobs.
  const auto layout = dir / "test" / "toy";
  EXPECT_TRUE(std::filesystem::is_regular_file(layout / "oci-layout"));
  EXPECT_EQ(sha256_of_file(layout / "blobs" / "sha256" / index_.hex), index_);
  EXPECT_TRUE(std::filesystem::exists(layout / "blobs" / "sha256" / cpu_.entry.digest.hex));
  EXPECT_TRUE(std::filesystem::exists(layout / "blobs" / "sha256" / cuda_.entry.digest.hex));
  EXPECT_TRUE(std::filesystem::exists(layout / "blobs" / "sha256" / cpu_.layer.digest.hex));
  EXPECT_FALSE(std::filesystem::exists(layout / "blobs" / "sha256" / cuda_.layer.digest.hex));
  EXPECT_TRUE(std::filesystem::is_regular_file(layout / signature_sidecar_rel(index_)));
  oci::Index idx = oci::parse_index(read_text(layout / "index.json"), "index.json");
  ASSERT_EQ(idx.manifests.size(), 1u);
  EXPECT_EQ(idx.manifests[0].digest, index_);
  EXPECT_EQ(idx.manifests[0].annotations.at(std::string(oci::kAnnotationRefName)), "v1");
  mirror::MirrorInfo info =
      mirror::MirrorInfo::parse(read_text(dir / mirror::kMirrorFile), "mirror json");
  EXPECT_EQ(info.source_hub_id, registry_address().id());
  ASSERT_EQ(info.refs.size(), 1u);
  EXPECT_EQ(info.refs[0].variants, std::set<Digest>{cpu_.entry.digest});
  // Nothing but the mirror beside it (the temp directory was renamed into place).
  size_t siblings = 0;
  for (auto& e : std::filesystem::directory_iterator(work_.path()))
    if (e.path().filename().string().starts_with(".mirror")) ++siblings;
  EXPECT_EQ(siblings, 0u);

  registry_.stop();

  ProcessResult im = import_offline(dir, cache_b);
  ASSERT_EQ(im.exit_code, 0) << im.err << im.out;
  json ij = json::parse(im.out);
  EXPECT_EQ(ij["source_hub_id"], registry_address().id());
  EXPECT_EQ(ij["mirror_hub_id"], HubAddress::parse(dir.string(), false).id());
  ASSERT_EQ(ij["refs"].size(), 1u) << ij.dump(2);
  EXPECT_EQ(ij["refs"][0]["variants_total"], 2);
  EXPECT_EQ(ij["refs"][0]["variants_complete"], 1);

  Store store_b(cache_b);
  ASSERT_TRUE(store_b.read_ref(registry_address().id(), "test/toy", "v1").has_value());
  EXPECT_EQ(store_b.read_ref(registry_address().id(), "test/toy", "v1")->digest, index_);
  EXPECT_TRUE(store_b.read_ref(HubAddress::parse(dir.string(), false).id(), "test/toy", "v1"));
  // Import caches verified blobs and unpacks nothing: a load unpacks, after its trust check.
  EXPECT_TRUE(store_b.has_blob(cpu_.layer.digest));
  EXPECT_FALSE(store_b.unpacked_path(cpu_.layer.digest).has_value());
  EXPECT_FALSE(store_b.has_blob(cuda_.layer.digest));

  // Offline against the original registry address, from cache B only.
  {
    Runtime rt;
    add_slots(rt, {"Scale", "ScaleInfer"});
    KernelizeReport r = kernelize(rt, config_, *hub(store_b, true), local_cpu_device(), {});
    EXPECT_EQ(r.fetched, 0u);
    expect_bound_from(r, BindingSource::kCache);
    expect_scale_works(rt);
    EXPECT_TRUE(store_b.unpacked_path(cpu_.layer.digest).has_value());
  }
  // Under the lock made on the registry.
  {
    KernelizeOptions o;
    o.lock = &lock;
    Runtime rt;
    add_slots(rt, {"Scale", "ScaleInfer"});
    KernelizeReport r = kernelize(rt, config_, *hub(store_b, true), local_cpu_device(), o);
    expect_bound_from(r, BindingSource::kCache);
  }
  // Imported content is not trusted more than fetched content: other keys refuse it.
  {
    trust::TrustStore other = trust::TrustStore::open(work_ / "other-keys");
    other.add(trust::PrivateKey::generate().public_key(), {"*"});
    KernelizeOptions o;
    o.trust_keys = &other;
    Runtime rt;
    add_slots(rt, {"Scale"});
    try {
      kernelize(rt, config_, *hub(store_b, true), local_cpu_device(), o);
      FAIL() << "an import bypassed the signature check";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kRefused) << e.what();
      EXPECT_NE(std::string(e.what()).find("test/toy"), std::string::npos) << e.what();
    }
    Vec x({1}), y({0});
    EXPECT_EQ(call_scale(rt, "Scale", x, 1, y), kFallbackStatus);
  }
  // The mirror directory's own hub id resolves offline too (--hub DIR --offline).
  {
    Runtime rt;
    add_slots(rt, {"Scale", "ScaleInfer"});
    KernelizeReport r =
        kernelize(rt, config_, *dir_hub(store_b, dir, true), local_cpu_device(), {});
    expect_bound_from(r, BindingSource::kCache);
  }
  // The CLI, offline against the registry address, from cache B.
  {
    ProcessResult r = cli({"resolve", "--config", config_path_.string(), "--device", "cpu"},
                          cache_b, {{"KERNEL_HUB_OFFLINE", "1"}});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(index_.str()), std::string::npos) << r.out;
  }
}

// A mirror never replaces another hub's ref record (a hostile mirror must not redirect the
// registry's tags): the cache's own record for the registry is kept, the mirror's is recorded
// under the mirror's id.
TEST_F(MirrorE2E, ImportNeverReplacesAnotherHubsRef) {
  const auto cache_a = work_ / "cache-a", cache_b = work_ / "cache-b";
  const auto dir = work_ / "mirror";
  {
    Store store(cache_a);
    Runtime rt;
    add_slots(rt, {"Scale"});
    kernelize(rt, config_, *hub(store), local_cpu_device(), {});
  }
  ASSERT_FALSE(export_cpu(cache_a, dir).is_null());
  const Digest other = sha256_of("another index the registry served earlier");
  {
    Store store_b(cache_b);
    store_b.write_ref(RefRecord{registry_address().id(), "test/toy", "v1", other, 1});
  }
  ProcessResult im = import_offline(dir, cache_b);
  ASSERT_EQ(im.exit_code, 0) << im.err << im.out;
  EXPECT_NE((im.err + im.out).find("never replaces another hub's record"), std::string::npos)
      << im.err << im.out;
  Store store_b(cache_b);
  EXPECT_EQ(store_b.read_ref(registry_address().id(), "test/toy", "v1")->digest, other);
  EXPECT_EQ(store_b.read_ref(HubAddress::parse(dir.string(), false).id(), "test/toy", "v1")->digest,
            index_);
}

TEST_F(MirrorE2E, TheMirrorServesAsAHubWithItsPartialIndex) {
  const auto dir = work_ / "mirror";
  ASSERT_FALSE(export_cpu(work_ / "cache-a", dir).is_null());
  registry_.stop();

  // --hub DIR, an empty cache: the package comes from the mirror, signature verified.
  TempDir cache("kh-mirror-hub");
  Store store(cache.path());
  auto h = dir_hub(store, dir, false);
  Runtime rt;
  add_slots(rt, {"Scale", "ScaleInfer"});
  KernelizeReport r = kernelize(rt, config_, *h, local_cpu_device(), {});
  EXPECT_EQ(r.fetched, 1u);
  expect_bound_from(r, BindingSource::kHub);
  expect_scale_works(rt);

  // The whole signed index is visible (every variant manifest), so resolution and locks see
  // what the source hub serves; the variant left out fails to fetch, saying the layout is
  // incomplete, and never as damage.
  RefInfo info = h->info(Ref::parse("test/toy@v1"));
  EXPECT_EQ(info.digest, index_);
  EXPECT_EQ(info.variants.size(), 2u);
  try {
    fetch_variant(*h, "test/toy", cuda_.entry, cuda_.layer, nullptr);
    FAIL() << "fetched a variant the mirror does not carry";
  } catch (const Error& e) {
    EXPECT_NE(e.kind(), ErrorKind::kIntegrity) << e.what();
    EXPECT_NE(std::string(e.what()).find("incomplete"), std::string::npos) << e.what();
  }

  // The CLI with --hub DIR: resolve for cpu and a lock made from the mirror.
  ProcessResult res = run_process(
      {cli_path(), "--cache", (work_ / "cache-c").string(), "--hub", dir.string(), "lock",
       "--config", config_path_.string(), "--target", "cpu", "-o", (work_ / "k.lock").string()},
      clean_env(), 120);
  EXPECT_EQ(res.exit_code, 0) << res.err;
  LockFile lock = LockFile::load(work_ / "k.lock");
  ASSERT_EQ(lock.entries.size(), 1u);
  EXPECT_EQ(lock.entries[0].index_digest, index_);
}

TEST_F(MirrorE2E, ATamperedBlobIsRefusedAtImportNamingIt) {
  const auto dir = work_ / "mirror";
  ASSERT_FALSE(export_cpu(work_ / "cache-a", dir).is_null());
  registry_.stop();
  const auto blob = dir / "test" / "toy" / "blobs" / "sha256" / cpu_.layer.digest.hex;
  ASSERT_EQ(::chmod(blob.c_str(), 0644), 0);
  {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char c = 0;
    f.get(c);
    f.seekp(100);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  ProcessResult r = import_offline(dir, work_ / "cache-b");
  EXPECT_EQ(r.exit_code, 1) << r.err << r.out;
  EXPECT_NE(r.err.find(cpu_.layer.digest.str()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tampered"), std::string::npos) << r.err;
  Store store(work_ / "cache-b");
  EXPECT_TRUE(store.list_refs().empty());  // nothing recorded
  EXPECT_FALSE(store.has_blob(cpu_.layer.digest));
}

TEST_F(MirrorE2E, ExportRefusesANonEmptyDirectoryAndForceReplacesOnlyAMirror) {
  const auto cache = work_ / "cache-a";
  const auto other = work_ / "not-a-mirror";
  fs::write_file_atomic(other / "precious.txt", "keep me");
  ProcessResult r = cli({"export", "--config", config_path_.string(), "-o", other.string()}, cache);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("not empty"), std::string::npos) << r.err;
  r = cli({"export", "--config", config_path_.string(), "-o", other.string(), "--force"}, cache);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(read_text(other / "precious.txt"), "keep me");

  const auto dir = work_ / "mirror";
  std::filesystem::create_directories(dir);  // an empty directory is fine
  ASSERT_FALSE(export_cpu(cache, dir).is_null());
  r = cli({"export", "--config", config_path_.string(), "-o", dir.string()}, cache);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  // --all-variants takes every variant: a --device beside it is refused, not ignored.
  r = cli({"export", "--config", config_path_.string(), "--device", "cpu", "--all-variants",
           "--force", "-o", dir.string()},
          cache);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("cannot be combined with --all-variants"), std::string::npos) << r.err;
  r = cli({"export", "--config", config_path_.string(), "--all-variants", "--force", "-o",
           dir.string(), "--json"},
          cache);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json full = json::parse(r.out);
  EXPECT_EQ(full["refs"][0]["variants_exported"], 2);
  EXPECT_TRUE(
      std::filesystem::exists(dir / "test" / "toy" / "blobs" / "sha256" / cuda_.layer.digest.hex));
}

// --- the demo from a mirror of the embedded default hub ---

constexpr const char* kDemoLayers[] = {"RMSNorm", "RotaryEmbedding", "SiluAndMul", "CrossEntropy",
                                       "Attention"};

void expect_demo_from(const ProcessResult& r, const std::string& source) {
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json j = json::parse(r.out);
  ASSERT_EQ(j["bindings"].size(), 10u) << j["bindings"].dump(2);
  for (const char* mode : {"eval", "train"})
    for (const char* layer : kDemoLayers) {
      bool found = false;
      for (auto& b : j["bindings"]) {
        if (b["layer"] != layer || b["mode"] != mode) continue;
        found = true;
        EXPECT_EQ(b["source"], source) << b.dump(2);
        EXPECT_TRUE(b["package"].get<std::string>().starts_with("kernel-hub/")) << b.dump(2);
      }
      EXPECT_TRUE(found) << layer << " " << mode;
    }
  const float first = j["train"]["first_loss"], last = j["train"]["last_loss"];
  EXPECT_EQ(j["train"]["steps"], 30);
  EXPECT_GT(first, 5.0f);
  EXPECT_LT(last, first - 1.0f);
}

TEST(MirrorDemo, ExportTheDemoConfigImportOfflineAndRunTheDemo) {
  TempDir work("kh-mirror-demo");
  const auto dir = work / "mirror";
  const std::string config = (source_dir() / "manifests/examples/demo-config.json").string();
  // Exported from the embedded default hub (no --hub, no KERNEL_HUB_ENDPOINT).
  ProcessResult ex =
      run_process({cli_path(), "--cache", (work / "cache-a").string(), "export", "--config", config,
                   "--device", "cpu", "-o", dir.string(), "--json"},
                  clean_env(), 240);
  ASSERT_EQ(ex.exit_code, 0) << ex.err << ex.out;
  json ej = json::parse(ex.out);
  EXPECT_EQ(ej["refs"].size(), 5u) << ej.dump(2);
  for (auto& r : ej["refs"]) {
    EXPECT_EQ(r["variants_exported"], 1) << r.dump(2);
    EXPECT_GE(r["signatures"].get<int>(), 1) << r.dump(2);
  }

  // The air-gapped machine: network off for everything, an empty cache filled from the mirror.
  const Env offline = clean_env({{"KERNEL_HUB_OFFLINE", "1"}});
  ProcessResult im = run_process(
      {cli_path(), "--cache", (work / "cache-b").string(), "import", dir.string(), "--json"},
      offline, 240);
  ASSERT_EQ(im.exit_code, 0) << im.err << im.out;
  EXPECT_EQ(json::parse(im.out)["refs"].size(), 5u);
  ProcessResult demo = run_process({cli_path(), "--cache", (work / "cache-b").string(), "demo",
                                    "--device", "cpu", "--steps", "30", "--json"},
                                   offline, 240);
  ASSERT_NO_FATAL_FAILURE(expect_demo_from(demo, "cache"));
  EXPECT_EQ(json::parse(demo.out)["fetched"], 0);

  // Or the mirror itself as the hub, into another empty cache.
  ProcessResult served =
      run_process({cli_path(), "--cache", (work / "cache-c").string(), "--hub", dir.string(),
                   "demo", "--device", "cpu", "--steps", "30", "--json"},
                  clean_env(), 240);
  ASSERT_NO_FATAL_FAILURE(expect_demo_from(served, "hub"));
  EXPECT_EQ(json::parse(served.out)["fetched"], 5);
}

}  // namespace
}  // namespace kh::test
