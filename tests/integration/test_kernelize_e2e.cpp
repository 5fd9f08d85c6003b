// kernelize end to end on cpu against a real docker-registry: the toy package packed by
// pack_package and pushed with Hub::push; kernelize from a config binds both modes, calls give
// the right results, set_mode swaps; a lock round trip; a tampered hub under the lock; offline
// from the cache with the registry stopped; the CLI's resolve, why, lock, pull --config/--lock
// and pack.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/transport/source.h"
#include "registry/kernelize.h"
#include "registry/lock_file.h"
#include "tests/fixtures/process.h"
#include "tests/fixtures/registry_fixture.h"
#include "tests/unit/test_kernelize_util.h"

namespace kh::test {
namespace {

class KernelizeE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!registry_.available()) GTEST_SKIP() << registry_.why();
    push("toy-1.0.0", "test/toy@v1");
  }

  HubOptions options(bool offline = false) {
    HubOptions o;
    o.progress = false;
    o.offline = offline;
    o.source.http.allow_plain_http = true;
    return o;
  }
  std::unique_ptr<Hub> hub(Store& store, bool offline = false) {
    return std::make_unique<Hub>(HubAddress::parse(registry_.oci_url(), true), store,
                                 options(offline));
  }

  // Packs a toy variant (cpu, tagged with ref's tag) and pushes it under ref; returns the index
  // digest.
  Digest push(const std::string& variant, const std::string& ref_text) {
    Ref ref = Ref::parse(ref_text);
    layouts_.push_back(std::make_unique<TempDir>("kh-layout"));
    PackOptions o;
    o.package_dir = toy_package(variant);
    o.output = layouts_.back()->path();
    o.devices = {"cpu"};
    o.tags = {ref.tag};
    sign_as_test_publisher(o, ref.repo);
    PackReport r = pack_package(o);
    Store push_store(push_cache_.path());
    hub(push_store)->push(layouts_.back()->path(), ref);
    return r.index.digest;
  }

  ProcessResult cli(const std::vector<std::string>& args, const std::filesystem::path& cache,
                    Env env = {}) {
    std::vector<std::string> argv = {cli_path(),     "--cache", cache.string(),
                                     "--plain-http", "--hub",   registry_.oci_url()};
    argv.insert(argv.end(), args.begin(), args.end());
    env.emplace("KERNEL_HUB_BACKOFF_S", "0.05");
    env.emplace("KERNEL_HUB_OFFLINE", "\x01");
    env.emplace("KERNEL_HUB_ENDPOINT", "\x01");
    env.emplace("KERNEL_HUB_LOCAL", "\x01");
    env.emplace("KERNEL_HUB_DISABLE", "\x01");
    return run_process(argv, env, 120);
  }

  std::filesystem::path write_config(const TempDir& dir) {
    auto path = dir / "kernels.json";
    fs::write_file_atomic(path, toy_config("test/toy"));
    return path;
  }

  RegistryFixture registry_;
  TempDir push_cache_{"kh-push-cache"};
  std::vector<std::unique_ptr<TempDir>> layouts_;
  KernelConfig config_ = KernelConfig::parse(toy_config("test/toy"));
};

TEST_F(KernelizeE2E, BindsCpuOpsInBothModesAndSwaps) {
  TempDir cache("kh-cache");
  Store store(cache.path());
  auto h = hub(store);
  Runtime rt;
  add_slots(rt, {"Scale", "ScaleInfer", "Other"});
  KernelizeReport r = kernelize(rt, config_, *h, local_cpu_device(), {});
  SCOPED_TRACE(r.str());
  EXPECT_EQ(r.fetched, 1u);  // one package, one variant, for every slot and mode
  for (Mode m : {Mode::kEval, Mode::kTrain}) {
    const KernelizeBinding* b = r.find("Scale", m);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->source, BindingSource::kHub);
    EXPECT_EQ(b->package, "toy@1.0.0");
    EXPECT_EQ(b->kernel, "test/toy@v1:Scale");
    EXPECT_FALSE(b->resolution.trace.empty());
  }
  EXPECT_EQ(r.find("ScaleInfer", Mode::kTrain)->source, BindingSource::kFallback);
  EXPECT_EQ(r.find("Other", Mode::kEval)->source, BindingSource::kFallback);

  Vec x({1, -2, 4}), y({0, 0, 0});
  rt.set_mode(Mode::kEval);
  ASSERT_EQ(call_scale(rt, "Scale", x, 0.5, y), KH_OK);
  EXPECT_EQ(y.data, (std::vector<float>{0.5f, -1, 2}));
  ASSERT_EQ(call_scale(rt, "ScaleInfer", x, 2, y), KH_OK);
  EXPECT_EQ(y.data, (std::vector<float>{2, -4, 8}));
  rt.set_mode(Mode::kTrain);
  EXPECT_EQ(call_scale(rt, "ScaleInfer", x, 2, y), kFallbackStatus);
  ASSERT_EQ(call_scale(rt, "Scale", x, 3, y), KH_OK);
  EXPECT_EQ(y.data, (std::vector<float>{3, -6, 12}));
  ASSERT_EQ(call_scale(rt, "Scale", x, 3, y, /*backward=*/true), KH_OK);
  EXPECT_EQ(y.data, (std::vector<float>{3, -6, 12}));
  rt.set_mode(Mode::kEval);
  ASSERT_EQ(call_scale(rt, "ScaleInfer", x, 1, y), KH_OK);
  EXPECT_EQ(y.data, (std::vector<float>{1, -2, 4}));
}

TEST_F(KernelizeE2E, OfflineFromTheCacheWithTheRegistryStopped) {
  TempDir cache("kh-cache");
  Store store(cache.path());
  {
    Runtime rt;
    add_slots(rt, {"Scale"});
    kernelize(rt, config_, *hub(store), local_cpu_device(), {});
  }
  registry_.stop();
  Runtime rt;
  add_slots(rt, {"Scale", "ScaleInfer"});
  KernelizeReport r = kernelize(rt, config_, *hub(store, /*offline=*/true), local_cpu_device(), {});
  EXPECT_EQ(r.fetched, 0u);
  EXPECT_EQ(r.find("Scale", Mode::kTrain)->source, BindingSource::kCache) << r.str();
  Vec x({2}), y({0});
  ASSERT_EQ(call_scale(rt, "Scale", x, 4, y), KH_OK);
  EXPECT_EQ(y.data[0], 8.0f);
  // Online with the registry gone, a fresh ref record (TTL) answers without a request.
  HubOptions ttl = options();
  ttl.ref_ttl_s = 600;
  Hub online(HubAddress::parse(registry_.oci_url(), true), store, ttl);
  Runtime rt2;
  add_slots(rt2, {"Scale"});
  EXPECT_EQ(kernelize(rt2, config_, online, local_cpu_device(), {}).fetched, 0u);
  // A cache that never saw the package names the command to run.
  TempDir empty("kh-cache");
  Store empty_store(empty.path());
  Runtime rt3;
  add_slots(rt3, {"Scale"});
  KernelizeReport miss = kernelize(rt3, config_, *hub(empty_store, true), local_cpu_device(), {});
  const KernelizeBinding* b = miss.find("Scale", Mode::kEval);
  EXPECT_EQ(b->source, BindingSource::kFallback);
  EXPECT_NE(format_trace(b->resolution).find("kernel-hub pull"), std::string::npos)
      << format_trace(b->resolution);
}

TEST_F(KernelizeE2E, LockRoundTripAndATamperedHub) {
  TempDir work("kh-lock");
  Store store(work / "cache");
  auto h = hub(store);
  KernelizeIndexProvider provider(*h);
  LockBuild built = build_lock(config_, {local_cpu_device()}, provider);
  ASSERT_TRUE(built.misses.empty()) << built.misses.front();
  built.lock.save(work / "kernels.lock");
  LockFile lock = LockFile::load(work / "kernels.lock");
  EXPECT_EQ(lock, built.lock);
  ASSERT_EQ(lock.entries.size(), 1u);  // test/toy@v1 (both spellings name the same ref)

  KernelizeOptions o;
  o.lock = &lock;
  Runtime rt;
  add_slots(rt, {"Scale"});
  KernelizeReport r = kernelize(rt, config_, *h, local_cpu_device(), o);
  EXPECT_EQ(r.find("Scale", Mode::kEval)->index_digest, lock.entries[0].index_digest);
  EXPECT_EQ(*r.find("Scale", Mode::kEval)->variant_digest,
            lock.entries[0].targets.begin()->second.manifest_digest);

  // Offline under the lock: resolved from the locked digests.
  Runtime rt_off;
  add_slots(rt_off, {"Scale"});
  EXPECT_EQ(kernelize(rt_off, config_, *hub(store, true), local_cpu_device(), o)
                .find("Scale", Mode::kEval)
                ->source,
            BindingSource::kCache);

  // Other bytes under the same tag: a kernelize that asks the hub refuses them.
  Digest tampered = push("toy-2.0.0", "test/toy@v1");
  ASSERT_NE(tampered, lock.entries[0].index_digest);
  Runtime rt2;
  add_slots(rt2, {"Scale"});
  try {
    kernelize(rt2, config_, *h, local_cpu_device(), o);
    FAIL() << "kernelize accepted bytes the lock does not name";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kIntegrity);
    EXPECT_NE(msg.find("test/toy@v1"), std::string::npos) << msg;
    EXPECT_NE(msg.find(lock.entries[0].index_digest.str()), std::string::npos) << msg;
    EXPECT_NE(msg.find(tampered.str()), std::string::npos) << msg;
  }
  Vec x({1}), y({0});
  EXPECT_EQ(call_scale(rt2, "Scale", x, 1, y), kFallbackStatus);  // nothing was bound
}

TEST_F(KernelizeE2E, CliResolveWhyLockPull) {
  TempDir work("kh-cli");
  auto config = write_config(work);
  auto cache = work / "cache";

  auto resolve = cli({"--json", "resolve", "--config", config.string()}, cache);
  ASSERT_EQ(resolve.exit_code, 0) << resolve.err;
  auto rj = nlohmann::json::parse(resolve.out);
  ASSERT_EQ(rj["modes"].size(), 2u);
  EXPECT_EQ(rj["modes"][0]["mode"], "eval");
  bool scale_seen = false;
  for (auto& l : rj["modes"][0]["layers"])
    if (l["layer"] == "Scale") {
      scale_seen = true;
      EXPECT_FALSE(l["fallback"].get<bool>());
      EXPECT_EQ(l["kernel"], "test/toy@v1:Scale");
    }
  EXPECT_TRUE(scale_seen) << resolve.out;

  auto why = cli({"why", "Scale", "--config", config.string(), "--device", "cuda", "--sm", "90",
                  "--cuda", "13.0", "--mode", "eval"},
                 cache);
  ASSERT_EQ(why.exit_code, 0) << why.err;
  EXPECT_NE(why.out.find("runtime fallback"), std::string::npos) << why.out;  // no cuda entry
  auto why_cpu = cli({"why", "Scale", "--config", config.string()}, cache);
  EXPECT_NE(why_cpu.out.find("[variant] accepted"), std::string::npos) << why_cpu.out;

  auto lock_path = work / "kernels.lock";
  auto lock = cli(
      {"lock", "--config", config.string(), "--target", "cpu", "-o", lock_path.string()}, cache);
  ASSERT_EQ(lock.exit_code, 0) << lock.err;
  LockFile lf = LockFile::load(lock_path);
  ASSERT_EQ(lf.entries.size(), 1u);
  // A target no variant fits: nothing written, the miss named.
  auto bad = cli({"lock", "--config", config.string(), "--target", "cpu:linux/riscv64", "-o",
                  (work / "bad.lock").string()},
                 cache);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("riscv64"), std::string::npos) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(work / "bad.lock"));

  // pull --config into a fresh cache fetches the cpu variant only; pull --lock the locked one.
  auto fresh = work / "fresh";
  auto pull = cli({"--json", "pull", "--config", config.string()}, fresh);
  ASSERT_EQ(pull.exit_code, 0) << pull.err;
  auto pj = nlohmann::json::parse(pull.out);
  ASSERT_EQ(pj.size(), 1u) << pull.out;
  EXPECT_TRUE(pj[0]["fetched"].get<bool>());
  EXPECT_EQ(pj[0]["layer_digest"], lf.entries[0].targets.begin()->second.layer_digest.str());
  auto locked = cli({"--json", "pull", "--lock", lock_path.string()}, work / "fresh2");
  ASSERT_EQ(locked.exit_code, 0) << locked.err;
  EXPECT_EQ(nlohmann::json::parse(locked.out)[0]["manifest_digest"],
            lf.entries[0].targets.begin()->second.manifest_digest.str());
  // Both only cache: nothing is unpacked before a load's trust check.
  auto unpacked = [](const std::filesystem::path& cache_dir) {
    std::vector<std::string> names;
    for (auto& e : std::filesystem::directory_iterator(cache_dir / "unpacked"))
      names.push_back(e.path().filename().string());
    return names;
  };
  EXPECT_TRUE(unpacked(fresh).empty());
  EXPECT_TRUE(unpacked(work / "fresh2").empty());
  // Then kernelize offline from what pull --config fetched: it unpacks the package.
  Store store(fresh);
  Runtime rt;
  add_slots(rt, {"Scale"});
  KernelizeReport r = kernelize(rt, config_, *hub(store, true), local_cpu_device(), {});
  EXPECT_EQ(r.find("Scale", Mode::kEval)->source, BindingSource::kCache) << r.str();
  EXPECT_EQ(unpacked(fresh),
            std::vector<std::string>{lf.entries[0].targets.begin()->second.layer_digest.hex});
  EXPECT_NE(cli({"pull"}, fresh).exit_code, 0);  // nothing named: a usage error
}

// No silent fallback: every entry that cannot be served is a warning naming why (exit 0), or
// with --strict an error (exit 1); lock leaves such entries out, or with --strict writes nothing.
TEST_F(KernelizeE2E, CliStrictReportsEveryUnservedEntry) {
  TempDir work("kh-strict");
  auto config = work / "kernels.json";
  fs::write_file_atomic(config, R"({
    "Scale": {"cpu": {"eval": "test/toy@v1", "train": "test/toy@v1"}},
    "HfRepo": {"cpu": {"eval": "kernels-community/activation:SiluAndMul"}},
    "NoTag": {"cpu": {"eval": "test/toy@v9:Scale"}},
    "Branch": {"cpu": {"eval": ["test/toy:Scale", {"revision": "main"}]}},
    "Commit": {"cpu": {"eval": "test/toy@0123456789abcdef0123456789abcdef01234567:Scale"}},
    "NoLayer": {"cpu": {"eval": "test/toy@v1:NoSuchLayer"}},
    "Other": {"rocm": "test/toy:Scale"},
    "Upper": {"cpu": {"eval": "Test/Toy@v1:Scale"}}
  })");
  auto cache = work / "cache";
  auto resolve = cli({"resolve", "--config", config.string(), "--mode", "eval"}, cache);
  ASSERT_EQ(resolve.exit_code, 0) << resolve.err;
  const std::string& err = resolve.err;
  for (const char* want : {
           "warning: unserved: HfRepo eval: eval: kernels-community/activation@v1:SiluAndMul: ",
           "kernels-community/activation is a Hugging Face Hub repository: this hub does not "
           "hold it",
           "warning: unserved: NoTag eval: eval: test/toy@v9:Scale: ",
           "test/toy has: v1",  // the not-found lists what exists
           "warning: unserved: Branch eval: eval: test/toy@main:Scale: ",
           "revision 'main' is a branch name",
           "looks like a git commit",
           "warning: unserved: NoLayer eval: eval: test/toy@v1:NoSuchLayer: package toy 1.0.0 "
           "(test/toy@v1) has no layer NoSuchLayer (has: Scale, ScaleInfer)",
           "note: $.Other.rocm: device key rocm kept but skipped on this system",
           "note: $.Upper.cpu.eval: repository Test/Toy looked up as test/toy",
       })
    EXPECT_NE(err.find(want), std::string::npos) << "want: " << want << "\nstderr:\n" << err;
  EXPECT_EQ(err.find("unserved: Scale "), std::string::npos) << err;  // served
  EXPECT_EQ(err.find("unserved: Other "), std::string::npos) << err;  // not mapped for cpu
  EXPECT_EQ(err.find("unserved: Upper "), std::string::npos) << err;  // served as test/toy

  auto strict =
      cli({"--json", "resolve", "--config", config.string(), "--mode", "eval", "--strict"}, cache);
  EXPECT_EQ(strict.exit_code, 1) << strict.err;
  EXPECT_NE(strict.err.find("resolve --strict: 5 config entries cannot be served"),
            std::string::npos)
      << strict.err;
  auto sj = nlohmann::json::parse(strict.out);
  EXPECT_EQ(sj["unserved"].size(), 5u) << strict.out;
  for (auto& l : sj["modes"][0]["layers"])
    EXPECT_EQ(l.contains("unserved"),
              l["layer"] != "Scale" && l["layer"] != "Other" && l["layer"] != "Upper")
        << l.dump();

  // lock: served refs locked, unserved entries warned and left out; --strict writes nothing.
  auto lock_path = work / "kernels.lock";
  auto lock = cli(
      {"lock", "--config", config.string(), "--target", "cpu", "-o", lock_path.string()}, cache);
  ASSERT_EQ(lock.exit_code, 0) << lock.err;
  EXPECT_NE(lock.err.find("warning: unserved (not locked): HfRepo cpu eval"), std::string::npos)
      << lock.err;
  EXPECT_NE(lock.err.find("NoLayer cpu eval: test/toy@v1:NoSuchLayer: package toy 1.0.0 has no "
                          "layer NoSuchLayer"),
            std::string::npos)
      << lock.err;
  LockFile lf = LockFile::load(lock_path);
  ASSERT_EQ(lf.entries.size(), 1u);
  EXPECT_EQ(lf.entries[0].ref.str(), "test/toy@v1");
  auto strict_lock = cli({"lock", "--strict", "--config", config.string(), "--target", "cpu", "-o",
                          (work / "strict.lock").string()},
                         cache);
  EXPECT_EQ(strict_lock.exit_code, 1) << strict_lock.err;
  EXPECT_NE(strict_lock.err.find("lock --strict: 5 config entries cannot be served"),
            std::string::npos)
      << strict_lock.err;
  EXPECT_FALSE(std::filesystem::exists(work / "strict.lock"));

  // kernelize under that lock: the unserved entries fall back with their reason in the report.
  Store store(cache);
  Runtime rt;
  add_slots(rt, {"Scale", "HfRepo", "NoTag", "NoLayer", "Other"});
  KernelizeOptions o;
  o.lock = &lf;
  o.modes = {Mode::kEval};
  KernelizeReport r =
      kernelize(rt, KernelConfig::load(config.string()), *hub(store), local_cpu_device(), o);
  EXPECT_EQ(r.find("Scale", Mode::kEval)->source, BindingSource::kHub) << r.str();
  for (const char* layer : {"HfRepo", "NoTag", "NoLayer"}) {
    const KernelizeBinding* b = r.find(layer, Mode::kEval);
    EXPECT_EQ(b->source, BindingSource::kFallback);
    EXPECT_EQ(b->note.rfind("unserved: eval: ", 0), 0u) << b->note;
  }
  EXPECT_TRUE(r.find("Other", Mode::kEval)->resolution.unserved.empty());
  auto rj = r.to_json();
  EXPECT_EQ(rj["unserved"].size(), 3u) << rj.dump(2);
  // With strict, the first unserved mapped layer is an error.
  Runtime rt_strict;
  add_slots(rt_strict, {"NoTag"});
  o.strict = true;
  EXPECT_THROW(
      kernelize(rt_strict, KernelConfig::load(config.string()), *hub(store), local_cpu_device(), o),
      Error);
}

// versions lists tags semver-aware (registry, every page); a missing tag or repository lists
// what exists.
TEST_F(KernelizeE2E, CliVersionsAndNotFoundListings) {
  for (const char* tag : {"v2", "1.10.0", "1.2.0", "1.0.0", "2.0.0-rc1", "2.0.0", "latest", "v10"})
    push("toy-1.0.0", std::string("test/toy@") + tag);
  TempDir work("kh-versions");
  auto versions = cli({"--json", "versions", "test/toy"}, work / "cache");
  ASSERT_EQ(versions.exit_code, 0) << versions.err;
  auto vj = nlohmann::json::parse(versions.out);
  EXPECT_EQ(vj["channels"], nlohmann::json::array({"v1", "v2", "v10"})) << versions.out;
  EXPECT_EQ(vj["versions"],
            nlohmann::json::array({"1.0.0", "1.2.0", "1.10.0", "2.0.0-rc1", "2.0.0"}))
      << versions.out;
  EXPECT_EQ(vj["other"], nlohmann::json::array({"latest"})) << versions.out;
  // Signature referrers tags (sha256-...) are not versions.
  for (auto& t : vj["tags"]) EXPECT_FALSE(t.get<std::string>().starts_with("sha256-")) << t;
  auto text = cli({"versions", "test/toy"}, work / "cache");
  EXPECT_NE(text.out.find("channels: v1, v2, v10"), std::string::npos) << text.out;

  // Many tags: all listed (a registry that pages them gets its Link pages followed; this
  // docker-registry answers in one page), and a not-found lists the first 20.
  push("toy-1.0.0", "test/many@v1");
  SourceOptions so;
  so.http.allow_plain_http = true;
  auto src = open_registry_source(HubAddress::parse(registry_.oci_url(), true), so);
  FetchedManifest v1 = src->get_manifest("test/many", "v1");
  for (int i = 0; i < 130; ++i)
    src->push_manifest("test/many", fmt::format("0.{}.0", i), v1.bytes, v1.media_type);
  auto many = cli({"--json", "versions", "test/many"}, work / "cache");
  ASSERT_EQ(many.exit_code, 0) << many.err;
  auto mj = nlohmann::json::parse(many.out);
  ASSERT_EQ(mj["versions"].size(), 130u);
  EXPECT_EQ(mj["versions"][2], "0.2.0");
  EXPECT_EQ(mj["versions"][129], "0.129.0");
  auto many_missing = cli({"info", "test/many@v9"}, work / "cache");
  EXPECT_NE(many_missing.err.find("test/many has: v1, 0.0.0, 0.1.0"), std::string::npos)
      << many_missing.err;
  EXPECT_NE(many_missing.err.find("... and 111 more"), std::string::npos) << many_missing.err;

  auto missing_tag = cli({"info", "test/toy@v9"}, work / "cache");
  EXPECT_EQ(missing_tag.exit_code, 1);
  EXPECT_NE(missing_tag.err.find("test/toy has: v1, v2, v10, 1.0.0, 1.2.0, 1.10.0, 2.0.0-rc1, "
                                 "2.0.0, latest (kernel-hub versions test/toy)"),
            std::string::npos)
      << missing_tag.err;
  auto pull_missing = cli({"pull", "test/toy@v9"}, work / "cache");
  EXPECT_NE(pull_missing.err.find("test/toy has: v1"), std::string::npos) << pull_missing.err;
  auto missing_repo = cli({"info", "test/nothere@v1"}, work / "cache");
  EXPECT_NE(missing_repo.err.find("no repository test/nothere on"), std::string::npos)
      << missing_repo.err;
  auto bad = cli({"versions", "test/toy@v1"}, work / "cache");
  EXPECT_EQ(bad.exit_code, 2);
}

// The same on a layout hub: tags from index.json's ref names.
TEST_F(KernelizeE2E, CliVersionsOnALayoutHub) {
  TempDir hubdir("kh-layout-hub");
  PackOptions o;
  o.package_dir = toy_package("toy-1.0.0");
  o.output = hubdir.path();
  o.repo = "test/toy";
  o.devices = {"cpu"};
  o.tags = {"v1"};
  pack_package(o);
  o.package_dir = toy_package("toy-2.0.0");
  o.tags = {"v2"};
  pack_package(o);
  std::vector<std::string> argv = {cli_path(),
                                   "--cache",
                                   (hubdir / "cache").string(),
                                   "--hub",
                                   "file://" + hubdir.path().string(),
                                   "--json",
                                   "versions",
                                   "test/toy"};
  auto r = run_process(argv, {{"KERNEL_HUB_ENDPOINT", "\x01"}}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["channels"], nlohmann::json::array({"v1", "v2"})) << r.out;
  EXPECT_EQ(j["versions"], nlohmann::json::array({"1.0.0", "2.0.0"})) << r.out;
  argv = {cli_path(),
          "--cache",
          (hubdir / "cache").string(),
          "--hub",
          "file://" + hubdir.path().string(),
          "info",
          "test/toy@v7"};
  auto missing = run_process(argv, {{"KERNEL_HUB_ENDPOINT", "\x01"}}, 60);
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("tags present: 1.0.0, 2.0.0, v1, v2"), std::string::npos)
      << missing.err;
}

// A variant manifest copied alone (skopeo copy without --all) describes itself: it resolves on
// a device it fits and is refused, with the reason, on one it does not.
TEST_F(KernelizeE2E, SingleCopiedVariantManifestResolves) {
  if (!have_program("skopeo")) GTEST_SKIP() << "skopeo is not installed";
  std::string host = registry_.oci_url().substr(6);
  auto copy =
      run_process({"skopeo", "--insecure-policy", "copy", "--src-tls-verify=false",
                   "--dest-tls-verify=false", "--override-os", "linux", "--override-arch", "amd64",
                   "docker://" + host + "/test/toy:v1", "docker://" + host + "/test/toysingle:v1"},
                  {}, 120);
  ASSERT_EQ(copy.exit_code, 0) << copy.err;
  TempDir work("kh-single");
  auto info = cli({"--json", "info", "test/toysingle@v1"}, work / "cache");
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_EQ(nlohmann::json::parse(info.out)["media_type"],
            "application/vnd.oci.image.manifest.v1+json");
  auto config = work / "kernels.json";
  fs::write_file_atomic(config, R"({"Scale": "test/toysingle:Scale"})");
  auto cpu = cli({"--json", "resolve", "--strict", "--mode", "eval", "--config", config.string()},
                 work / "cache");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  auto layer = nlohmann::json::parse(cpu.out)["modes"][0]["layers"][0];
  EXPECT_FALSE(layer["fallback"].get<bool>()) << cpu.out;
  EXPECT_EQ(layer["variant"]["code"], "host code") << cpu.out;
  auto cuda = cli({"resolve", "--strict", "--mode", "eval", "--config", config.string(), "--device",
                   "cuda", "--sm", "90", "--cuda", "13.0"},
                  work / "cache");
  EXPECT_EQ(cuda.exit_code, 1) << cuda.err;
  EXPECT_NE(cuda.err.find("no variant of test/toysingle@v1 fits cuda sm_90"), std::string::npos)
      << cuda.err;
  auto why = cli({"why", "Scale", "--mode", "eval", "--config", config.string(), "--device", "cuda",
                  "--sm", "90", "--cuda", "13.0"},
                 work / "cache");
  EXPECT_NE(why.out.find("device cpu != cuda"), std::string::npos) << why.out;
  auto arm = cli({"why", "Scale", "--mode", "eval", "--config", config.string(), "--target",
                  "cpu:linux/arm64"},
                 work / "cache");
  EXPECT_NE(arm.out.find("architecture amd64 != device architecture arm64"), std::string::npos)
      << arm.out;
}

TEST_F(KernelizeE2E, CliPackThenPush) {
  TempDir work("kh-pack");
  auto layout = work / "layout";
  auto pack = cli({"--json", "pack", toy_package("toy-2.0.0").string(), "-o", layout.string(),
                   "--devices", "cpu"},
                  work / "cache");
  ASSERT_EQ(pack.exit_code, 0) << pack.err;
  auto pj = nlohmann::json::parse(pack.out);
  EXPECT_EQ(pj["tags"], nlohmann::json::array({"v2", "2.0.0"}));
  auto push = cli({"push", layout.string(), "test/toy2@v2"}, work / "cache");
  ASSERT_EQ(push.exit_code, 0) << push.err;
  auto info = cli({"--json", "info", "test/toy2@v2"}, work / "cache");
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_EQ(nlohmann::json::parse(info.out)["digest"], pj["index_digest"]);
  auto refused = cli({"pack", toy_package("toy-cudart").string(), "-o", (work / "x").string()},
                     work / "cache");
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("needed-libraries"), std::string::npos) << refused.err;
}

}  // namespace
}  // namespace kh::test
