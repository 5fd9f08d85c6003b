// Signed kernels end to end (REFERENCE 4): the toy package packed and signed (pack --sign or
// Hub::sign), pushed to a real docker-registry 2.8 (no referrers API: the signature travels in
// the referrers tag sha256-<hex>) or written to a layout hub directory (signature sidecar), then
// kernelized with a trust store of fresh random keys.
//
// Every refusal is checked for its kh::Error kind, for a message that names the ref and the
// check that failed, and for NOTHING LOADED: the runtime's slots still answer with their
// fallback and no library of the cache the package was fetched into is mapped in this process
// (the loader dlopens with RTLD_NODELETE, so a library once loaded stays visible to
// dl_iterate_phdr). Every accepted load checks the opposite, so the "nothing loaded" check can
// fail.
//
//   signed push + load; offline from the cache with the registry stopped, then a tampered cache
//   (package file, index blob, signature set); a tampered hub (index, variant manifest, layer,
//   a repacked file under the old signature); an untrusted key, a key trusted for other/* only,
//   an expired statement (online, offline within and beyond the grace period), a replayed older
//   serial, unsigned under the default policy and with allow_unsigned; the layout hub's sidecar;
//   the CLI's keygen, trust add/ls/rm, sign, pull.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/base/log.h"
#include "hub/hub.h"
#include "hub/oci/oci.h"
#include "hub/store/archive.h"
#include "hub/transport/source.h"
#include "hub/trust/signature.h"
#include "hub/trust/trust_store.h"
#include "registry/kernelize.h"
#include "tests/fixtures/process.h"
#include "tests/fixtures/registry_fixture.h"
#include "tests/unit/test_kernelize_util.h"

namespace kh::test {
namespace {

namespace stdfs = std::filesystem;

constexpr const char* kRepo = "test/toy";
constexpr const char* kRef = "test/toy@v1";
// The kind a hub serving other bytes for a layer gets (see TamperedLayerOnTheHubIsRefused).
constexpr ErrorKind kLayerMismatchKind = ErrorKind::kIntegrity;

int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Flips one byte of a file (made writable first, as the store keeps files read-only).
void flip_byte(const stdfs::path& file, std::streamoff offset_from_end = 1) {
  ::chmod(file.parent_path().c_str(), 0755);
  ::chmod(file.c_str(), 0644);
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f) << file;
  f.seekg(0, std::ios::end);
  std::streamoff size = f.tellg();
  ASSERT_GT(size, offset_from_end) << file;
  std::streamoff at = size - offset_from_end;
  f.seekg(at);
  char c = 0;
  f.get(c);
  c = static_cast<char>(c ^ 0x20);
  f.seekp(at);
  f.put(c);
  ASSERT_TRUE(f.good()) << file;
}

class TrustE2E : public ::testing::Test {
 protected:
  struct Packed {
    stdfs::path layout;  // a single OCI image layout (what Hub::push uploads)
    PackReport report;
    Digest index() const { return report.index.digest; }
  };

  void SetUp() override {
    ::unsetenv("KERNEL_HUB_ALLOW_UNSIGNED");
    ::unsetenv("KERNEL_HUB_OFFLINE_GRACE");
    // The loader's warnings (the unsigned and grace notes kernelize logs) are kept for checks.
    set_log_sink([this](int level, const std::string& line) {
      if (level < KH_LOG_WARN) return;
      std::lock_guard lock(log_mutex_);
      warnings_ += line + "\n";
    });
    if (!registry_.available()) GTEST_SKIP() << registry_.why();
  }
  void TearDown() override {
    set_log_sink({});
    ::unsetenv("KERNEL_HUB_OFFLINE_GRACE");
  }

  std::string warnings() {
    std::lock_guard lock(log_mutex_);
    return warnings_;
  }

  // --- hubs and caches ---

  HubOptions options(bool offline = false, trust::TrustPolicy policy = {}) {
    HubOptions o;
    o.progress = false;
    o.offline = offline;
    o.ref_ttl_s = 0;  // every online kernelize asks the hub what the tag points at
    o.source.http.allow_plain_http = true;
    o.trust = policy;
    return o;
  }
  std::unique_ptr<Hub> hub(Store& store, bool offline = false, trust::TrustPolicy policy = {}) {
    return std::make_unique<Hub>(HubAddress::parse(registry_.oci_url(), true), store,
                                 options(offline, policy));
  }
  std::unique_ptr<Source> registry_source() {
    SourceOptions o;
    o.http.allow_plain_http = true;
    return open_registry_source(HubAddress::parse(registry_.oci_url(), true), o);
  }
  // A fresh directory that lives as long as the test.
  const TempDir& temp(const std::string& prefix) {
    temps_.push_back(std::make_unique<TempDir>(prefix));
    return *temps_.back();
  }
  // A clean cache (its own directory, so "loaded from it" is a precise check).
  Store& cache() {
    const TempDir& dir = temp("kh-trust-cache");
    stores_.push_back(std::make_unique<Store>(dir.path()));
    return *stores_.back();
  }

  // A trust store on disk holding `key` for `patterns`.
  trust::TrustStore trust_keys(const trust::PrivateKey& key,
                               std::vector<std::string> patterns = {"test/*"}) {
    trust::TrustStore store = trust::TrustStore::open(temp("kh-trust-keys").path());
    store.add(key.public_key(), patterns);
    return trust::TrustStore::open(store.dir());
  }

  // --- packing and pushing ---

  // Packs a toy variant (cpu, tags v1 and its version) into a single layout; signed by `key`
  // for test/toy when given.
  Packed pack(const stdfs::path& package_dir, const trust::PrivateKey* key, uint64_t serial = 0,
              int64_t expires = 0) {
    Packed p;
    p.layout = temp("kh-trust-layout").path();
    PackOptions o;
    o.package_dir = package_dir;
    o.output = p.layout;
    o.devices = {"cpu"};
    o.sms = {};
    o.tags = {"v1"};
    o.sign_key = key;
    o.sign_repo = kRepo;
    o.sign_serial = serial;
    o.sign_expires = expires;
    p.report = pack_package(o);
    return p;
  }
  Packed pack_signed(const trust::PrivateKey& key, const std::string& variant = "toy-1.0.0",
                     uint64_t serial = 0, int64_t expires = 0) {
    return pack(toy_package(variant), &key, serial, expires);
  }
  Packed pack_unsigned(const std::string& variant = "toy-1.0.0") {
    return pack(toy_package(variant), nullptr);
  }
  PushReport push(const Packed& p, const std::string& ref = kRef) {
    return hub(push_store_)->push(p.layout, Ref::parse(ref));
  }

  // --- loading ---

  static void add_toy_slots(Runtime& rt) { add_slots(rt, {"Scale", "ScaleInfer"}); }

  KernelizeReport kernelize_with(Hub& h, const trust::TrustStore& keys, Runtime& rt) {
    KernelizeOptions o;
    o.trust_keys = &keys;
    return kernelize(rt, config_, h, local_cpu_device(), o);
  }
  // kernelize on a clean cache from the registry; returns the store used.
  Store& kernelize_fresh(const trust::TrustStore& keys, Runtime& rt, trust::TrustPolicy policy = {},
                         KernelizeReport* report = nullptr) {
    Store& store = cache();
    KernelizeReport r = kernelize_with(*hub(store, false, policy), keys, rt);
    if (report) *report = std::move(r);
    return store;
  }

  // Runs fn, which must throw kh::Error of `kind` whose message names `ref` and `check`.
  // Returns the message.
  std::string expect_refused(const std::function<void()>& fn, const std::string& ref,
                             const std::string& check, ErrorKind kind = ErrorKind::kRefused) {
    try {
      fn();
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_EQ(e.kind(), kind) << msg;
      EXPECT_TRUE(contains(msg, ref)) << "the message does not name " << ref << ": " << msg;
      EXPECT_TRUE(contains(msg, check))
          << "the message does not name the check '" << check << "': " << msg;
      return msg;
    }
    ADD_FAILURE() << "accepted; expected a refusal naming " << ref << " and '" << check << "'";
    return {};
  }

  // The package's slots still serve the runtime's fallback and no library of `store`'s cache
  // was mapped into this process.
  void expect_nothing_loaded(const Runtime& rt, const Store& store) {
    Vec x({1, 2}), y({0, 0});
    EXPECT_EQ(call_scale(rt, "Scale", x, 2, y), kFallbackStatus) << "Scale was bound";
    EXPECT_EQ(call_scale(rt, "ScaleInfer", x, 2, y), kFallbackStatus) << "ScaleInfer was bound";
    auto mapped = loaded_matching(stdfs::weakly_canonical(store.root()).string());
    EXPECT_TRUE(mapped.empty()) << "a library from the cache is mapped: " << mapped.front();
  }

  // The accepted side: both toy slots bound from the hub package, a library of `store` mapped,
  // and the binding's trust summary.
  void expect_loaded(const KernelizeReport& r, const Runtime& rt, const Store& store,
                     const std::string& trust_prefix) {
    SCOPED_TRACE(r.str());
    const KernelizeBinding* b = r.find("Scale", Mode::kEval);
    ASSERT_NE(b, nullptr);
    EXPECT_NE(b->source, BindingSource::kFallback) << b->note;
    EXPECT_EQ(b->kernel, "test/toy@v1:Scale");
    EXPECT_TRUE(b->trust.starts_with(trust_prefix)) << b->trust;
    Vec x({1, -2}), y({0, 0});
    EXPECT_EQ(call_scale(rt, "Scale", x, 3, y), KH_OK);
    EXPECT_EQ(y.data, (std::vector<float>{3, -6}));
    EXPECT_FALSE(loaded_matching(stdfs::weakly_canonical(store.root()).string()).empty())
        << "no library of the cache is mapped although the package was bound";
  }
  static std::string signed_by(const trust::PrivateKey& key) {
    return "signed by " + key.public_key().key_id().substr(0, 16);
  }

  // A blob of the registry's own storage (filesystem driver), found by digest.
  stdfs::path registry_blob(const Digest& d) {
    for (auto& e : stdfs::recursive_directory_iterator(registry_.dir())) {
      if (e.path().filename() == "data" && e.path().parent_path().filename() == d.hex)
        return e.path();
    }
    ADD_FAILURE() << "the registry's storage holds no blob " << d.str();
    return {};
  }

  RegistryFixture registry_;
  std::vector<std::unique_ptr<TempDir>> temps_;
  std::vector<std::unique_ptr<Store>> stores_;
  Store push_store_{temp("kh-trust-push").path()};
  KernelConfig config_ = KernelConfig::parse(toy_config(kRepo));
  std::mutex log_mutex_;
  std::string warnings_;
};

// 1. pack --sign, push: the referrers tag carries the signature; a clean cache loads it.
TEST_F(TrustE2E, SignedPushCarriesTheSignatureAndLoads) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  Packed p = pack_signed(key);
  ASSERT_EQ(p.report.signed_statements.size(), 2u);  // v1 and 1.0.0
  EXPECT_TRUE(stdfs::is_regular_file(p.layout / signature_sidecar_rel(p.index())));
  PushReport pushed = push(p);
  EXPECT_EQ(pushed.digest, p.index());
  EXPECT_EQ(pushed.signatures_pushed, 2u);
  EXPECT_EQ(pushed.signatures_skipped, 0u);

  // docker-registry 2.8 has no referrers API: the referrers tag sha256-<hex> lists them.
  Store probe(temp("kh-trust-probe").path());
  std::vector<std::string> tags = hub(probe)->tags(kRepo);
  EXPECT_NE(std::find(tags.begin(), tags.end(), "sha256-" + p.index().hex), tags.end())
      << "no referrers tag for " << p.index().str();
  trust::SignatureSet on_hub = hub(probe)->signatures(kRepo, p.index(), true);
  EXPECT_EQ(on_hub.envelopes.size(), 2u);

  Runtime rt;
  add_toy_slots(rt);
  KernelizeReport r;
  Store& store = kernelize_fresh(trust_keys(key), rt, {}, &r);
  EXPECT_EQ(r.fetched, 1u);
  expect_loaded(r, rt, store, signed_by(key));
  EXPECT_TRUE(contains(r.find("Scale", Mode::kEval)->trust,
                       "serial " + std::to_string(p.report.signed_statements[0].serial)));
  // The signatures were cached with the package, for offline loads.
  EXPECT_TRUE(store.read_signatures(p.index()).has_value());
  EXPECT_TRUE(warnings().empty()) << warnings();
}

// 2. Offline from the cache with the registry stopped; then a tampered cache is refused.
TEST_F(TrustE2E, OfflineFromTheCacheThenATamperedCacheIsRefused) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  Packed p = pack_signed(key);
  push(p);
  trust::TrustStore keys = trust_keys(key);

  // Caches filled while online: one by kernelize, three by pull (nothing loaded from those).
  Store& warm = cache();
  {
    Runtime rt;
    add_toy_slots(rt);
    kernelize_with(*hub(warm), keys, rt);
  }
  Store& file_cache = cache();
  Store& index_cache = cache();
  Store& sig_cache = cache();
  Store& garbage_sig_cache = cache();
  for (Store* s : {&file_cache, &index_cache, &sig_cache, &garbage_sig_cache}) {
    PullReport pr = hub(*s)->pull(Ref::parse(kRef));
    ASSERT_TRUE(pr.kernel_index);
    ASSERT_TRUE(s->read_signatures(p.index()).has_value());
  }
  registry_.stop();

  {
    Runtime rt;
    add_toy_slots(rt);
    KernelizeReport r = kernelize_with(*hub(warm, /*offline=*/true), keys, rt);
    EXPECT_EQ(r.fetched, 0u);
    EXPECT_EQ(r.find("Scale", Mode::kEval)->source, BindingSource::kCache) << r.str();
    expect_loaded(r, rt, warm, signed_by(key));
  }

  const Digest layer = p.report.variants.at(0).layer.digest;

  // A byte of a file of the unpacked package (pull unpacks nothing: the tree a load would make is
  // made here directly).
  {
    EXPECT_FALSE(file_cache.unpacked_path(layer).has_value());
    std::optional<stdfs::path> dir = file_cache.unpack(layer);
    flip_byte(*dir / "libtoy.so");
    Runtime rt;
    add_toy_slots(rt);
    expect_refused([&] { kernelize_with(*hub(file_cache, true), keys, rt); }, kRef,
                   "'libtoy.so' has digest", ErrorKind::kIntegrity);
    expect_nothing_loaded(rt, file_cache);
  }

  // A byte of the cached index blob: the store finds the damage and drops the entry; offline
  // the index is then missing, so the ref resolves to nothing and the slots keep the fallback.
  {
    flip_byte(index_cache.blob_path(p.index()), 3);
    Runtime rt;
    add_toy_slots(rt);
    // (The resolver turns an unavailable index into a fallback with a trace, it does not throw.)
    KernelizeReport r = kernelize_with(*hub(index_cache, true), keys, rt);
    for (Mode m : {Mode::kEval, Mode::kTrain}) {
      const KernelizeBinding* b = r.find("Scale", m);
      ASSERT_NE(b, nullptr);
      EXPECT_EQ(b->source, BindingSource::kFallback) << r.str();
      std::string trace = format_trace(b->resolution);
      EXPECT_TRUE(contains(trace, kRef + std::string(": index ") + p.index().str() +
                                      " is not in the cache and offline mode is on"))
          << trace;
    }
    expect_nothing_loaded(rt, index_cache);
    EXPECT_FALSE(stdfs::exists(index_cache.blob_path(p.index())));  // dropped, not trusted
  }

  // The cached signature set: a signature altered so the set still parses.
  {
    auto bytes = sig_cache.read_signatures(p.index());
    ASSERT_TRUE(bytes.has_value());
    trust::SignatureSet set = trust::SignatureSet::parse(*bytes, "cache");
    for (auto& e : set.envelopes) e.sigs[0].second[5] ^= 0x01;
    sig_cache.write_signatures(p.index(), set.serialize());
    Runtime rt;
    add_toy_slots(rt);
    expect_refused([&] { kernelize_with(*hub(sig_cache, true), keys, rt); }, kRef,
                   "bad signature by key " + key.public_key().key_id().substr(0, 16));
    expect_nothing_loaded(rt, sig_cache);
  }
  // ... and a set that no longer parses: offline, the package counts as unsigned.
  {
    garbage_sig_cache.write_signatures(p.index(), "{\"envelopes\": [tampered");
    Runtime rt;
    add_toy_slots(rt);
    expect_refused([&] { kernelize_with(*hub(garbage_sig_cache, true), keys, rt); }, kRef,
                   "not signed");
    expect_nothing_loaded(rt, garbage_sig_cache);
  }
}

// 3a. The tag re-pointed at an index whose bytes differ from the signed digest: unsigned, and
// with the old signature copied onto it.
TEST_F(TrustE2E, TamperedIndexOnTheHubIsRefused) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  Packed p = pack_signed(key);
  push(p);
  trust::TrustStore keys = trust_keys(key);

  auto src = registry_source();
  FetchedManifest original = src->get_manifest(kRepo, "v1");
  ASSERT_EQ(original.digest, p.index());
  nlohmann::json j = nlohmann::json::parse(original.bytes);
  j["annotations"]["org.example.tampered"] = "yes";
  std::string bytes = j.dump();
  oci::Descriptor tampered = oci::describe(bytes, oci::kMediaTypeIndex);
  ASSERT_NE(tampered.digest, p.index());
  src->push_manifest(kRepo, "v1", bytes, oci::kMediaTypeIndex);

  {
    Runtime rt;
    add_toy_slots(rt);
    expect_refused([&] { kernelize_fresh(keys, rt); }, kRef,
                   "not signed (no signature for index " + tampered.digest.str());
    expect_nothing_loaded(rt, *stores_.back());
  }

  // The attacker attaches the original, valid envelopes to the tampered index.
  for (auto& e : src->get_signatures(kRepo, p.report.index).envelopes)
    src->push_signature(kRepo, tampered, e);
  {
    Runtime rt;
    add_toy_slots(rt);
    expect_refused(
        [&] { kernelize_fresh(keys, rt); }, kRef,
        "signed index digest " + p.index().str() + " but the hub served " + tampered.digest.str());
    expect_nothing_loaded(rt, *stores_.back());
  }

  // Positive control: the tag moved back to the signed index loads again.
  src->push_manifest(kRepo, "v1", original.bytes, oci::kMediaTypeIndex);
  Runtime rt;
  add_toy_slots(rt);
  KernelizeReport r;
  Store& store = kernelize_fresh(keys, rt, {}, &r);
  expect_loaded(r, rt, store, signed_by(key));
}

// 3b. The registry serves other bytes for the signed index's variant manifest.
TEST_F(TrustE2E, TamperedVariantManifestOnTheHubIsRefused) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  Packed p = pack_signed(key);
  push(p);
  const Digest manifest = p.report.variants.at(0).entry.digest;
  stdfs::path blob = registry_blob(manifest);
  ASSERT_FALSE(blob.empty());
  // A space before the closing brace keeps it valid JSON with other bytes.
  std::string bytes = fs::read_file(blob, 1 << 20);
  ASSERT_EQ(bytes.back(), '}');
  bytes.insert(bytes.size() - 1, " ");
  fs::write_file_atomic(blob, bytes, 0644);

  Runtime rt;
  add_toy_slots(rt);
  Store& store = cache();
  // The index fetch verifies every manifest it lists: the kIntegrity error refuses the whole
  // kernelize (tampering is not absence), naming the ref and the mismatch.
  expect_refused([&] { kernelize_with(*hub(store), trust_keys(key), rt); }, kRef,
                 "registry says Docker-Content-Digest " + manifest.str() + " but the bytes hash to",
                 ErrorKind::kIntegrity);
  expect_nothing_loaded(rt, store);
  EXPECT_FALSE(store.has_blob(manifest));
}

// 3c. The registry serves other bytes for the package layer.
TEST_F(TrustE2E, TamperedLayerOnTheHubIsRefused) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  Packed p = pack_signed(key);
  push(p);
  const Digest layer = p.report.variants.at(0).layer.digest;
  stdfs::path blob = registry_blob(layer);
  ASSERT_FALSE(blob.empty());
  flip_byte(blob, 7);

  Runtime rt;
  add_toy_slots(rt);
  Store& store = cache();
  // Hub::fetch_missing reports a digest mismatch among "could not fetch every blob" as
  // kNetwork (it retries nothing of it; kIntegrity would be the documented kind).
  expect_refused([&] { kernelize_with(*hub(store), trust_keys(key), rt); }, kRef,
                 layer.str() + ": blob digest mismatch", kLayerMismatchKind);
  expect_nothing_loaded(rt, store);
  EXPECT_FALSE(store.has_blob(layer));
  EXPECT_FALSE(store.unpacked_path(layer).has_value());
}

// 3d. One file of the package changed and repacked, the old signature kept beside the new index
// (as a publisher's careless re-push, or an attacker, would): the digest check refuses it.
TEST_F(TrustE2E, RepackedFileUnderTheOldSignatureIsRefused) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  Packed original = pack_signed(key);

  // The same package with one file changed: bytes appended to the host library (still a
  // valid ELF file that passes pack's preflight).
  stdfs::path pkg = temp("kh-trust-pkg").path() / "toy";
  stdfs::copy(toy_package("toy-1.0.0"), pkg, stdfs::copy_options::recursive);
  {
    std::ofstream lib(pkg / "libtoy.so", std::ios::binary | std::ios::app);
    lib << "tampered";
  }
  Packed repacked = pack(pkg, nullptr);
  ASSERT_NE(repacked.index(), original.index());
  stdfs::path sidecar = repacked.layout / signature_sidecar_rel(repacked.index());
  stdfs::create_directories(sidecar.parent_path());
  stdfs::copy_file(original.layout / signature_sidecar_rel(original.index()), sidecar);

  PushReport pushed = push(repacked);
  EXPECT_EQ(pushed.signatures_pushed, 2u);  // the old envelopes, now referring to the new index

  Runtime rt;
  add_toy_slots(rt);
  expect_refused([&] { kernelize_fresh(trust_keys(key), rt); }, kRef,
                 "signed index digest " + original.index().str() + " but the hub served " +
                     repacked.index().str());
  expect_nothing_loaded(rt, *stores_.back());
}

// 4a. Signed by a key the store does not hold.
TEST_F(TrustE2E, UntrustedKeyIsRefused) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  trust::PrivateKey other = trust::PrivateKey::generate();
  push(pack_signed(key));
  Runtime rt;
  add_toy_slots(rt);
  std::string msg = expect_refused(
      [&] { kernelize_fresh(trust_keys(other), rt); }, kRef,
      "signature by key " + key.public_key().key_id().substr(0, 16) + "... which is not trusted");
  EXPECT_TRUE(contains(msg, "kernel-hub trust add")) << msg;
  expect_nothing_loaded(rt, *stores_.back());

  Runtime ok;
  add_toy_slots(ok);
  KernelizeReport r;
  Store& store = kernelize_fresh(trust_keys(key), ok, {}, &r);
  expect_loaded(r, ok, store, signed_by(key));
}

// 4b. The signer is trusted, but only for other/*.
TEST_F(TrustE2E, KeyTrustedForAnotherRepoIsRefused) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  push(pack_signed(key));
  Runtime rt;
  add_toy_slots(rt);
  expect_refused([&] { kernelize_fresh(trust_keys(key, {"other/*"}), rt); }, kRef,
                 "is trusted only for other/*, not for test/toy");
  expect_nothing_loaded(rt, *stores_.back());

  Runtime ok;
  add_toy_slots(ok);
  KernelizeReport r;
  Store& store = kernelize_fresh(trust_keys(key, {"other/*", "test/toy"}), ok, {}, &r);
  expect_loaded(r, ok, store, signed_by(key));
}

// 4b'. A key removed from the trust store (kernelize's default store, KERNEL_HUB_TRUST_DIR) no
// longer vouches for the package, even through a Hub object that accepted it before.
TEST_F(TrustE2E, RemovedKeyIsRefusedByTheSameHub) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  push(pack_signed(key));
  const TempDir& dir = temp("kh-trust-dir");
  trust::TrustStore::open(dir.path()).add(key.public_key(), {"test/*"});
  const char* saved = std::getenv("KERNEL_HUB_TRUST_DIR");
  std::string saved_value = saved ? saved : "";
  ::setenv("KERNEL_HUB_TRUST_DIR", dir.path().c_str(), 1);

  Store& store = cache();
  auto h = hub(store);
  {
    Runtime rt;
    add_toy_slots(rt);
    KernelizeReport r = kernelize(rt, config_, *h, local_cpu_device(), {});
    expect_loaded(r, rt, store, signed_by(key));
  }
  trust::TrustStore::open(dir.path()).remove(key.public_key().key_id());
  {
    Runtime rt;
    add_toy_slots(rt);
    expect_refused([&] { kernelize(rt, config_, *h, local_cpu_device(), {}); }, kRef,
                   "which is not trusted");
    Vec x({1}), y({0});
    EXPECT_EQ(call_scale(rt, "Scale", x, 2, y), kFallbackStatus);
  }
  if (saved) {
    ::setenv("KERNEL_HUB_TRUST_DIR", saved_value.c_str(), 1);
  } else {
    ::unsetenv("KERNEL_HUB_TRUST_DIR");
  }
}

// 4b''. One Hub, the trust store rebuilt in place with other keys (the same address, as a
// store re-read after `trust rm` gets): the decision for the old keys must not be reused.
TEST_F(TrustE2E, TrustStoreReplacedInPlaceIsNotServedAnOldDecision) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  push(pack_signed(key));
  Store& store = cache();
  auto h = hub(store);
  std::optional<trust::TrustStore> slot;
  slot.emplace(trust_keys(key));
  {
    Runtime rt;
    add_toy_slots(rt);
    expect_loaded(kernelize_with(*h, *slot, rt), rt, store, signed_by(key));
  }
  slot.reset();
  slot.emplace(trust_keys(trust::PrivateKey::generate()));
  Runtime rt;
  add_toy_slots(rt);
  expect_refused(
      [&] { kernelize_with(*h, *slot, rt); }, kRef,
      "signature by key " + key.public_key().key_id().substr(0, 16) + "... which is not trusted");
  Vec x({1}), y({0});
  EXPECT_EQ(call_scale(rt, "Scale", x, 2, y), kFallbackStatus);
  EXPECT_EQ(call_scale(rt, "ScaleInfer", x, 2, y), kFallbackStatus);
}

// 4c. An expired statement (Hub::sign with an expiry in the past): refused online; offline
// accepted with a warning within the grace period, refused beyond it (policy and environment).
TEST_F(TrustE2E, ExpiredStatementOnlineRefusedOfflineWithinGrace) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  Packed p = pack_unsigned();
  push(p);
  SignOptions so;
  so.expires = now_s() - 3600;
  Store sign_store(temp("kh-trust-sign").path());
  SignReport signed_report = hub(sign_store)->sign(Ref::parse(kRef), key, so);
  EXPECT_EQ(signed_report.statement.index, p.index());
  EXPECT_EQ(signed_report.key_id, key.public_key().key_id());
  trust::TrustStore keys = trust_keys(key);

  {
    Runtime rt;
    add_toy_slots(rt);
    expect_refused([&] { kernelize_fresh(keys, rt); }, kRef,
                   "statement expired at " + trust::format_time_rfc3339(so.expires));
    expect_nothing_loaded(rt, *stores_.back());
  }

  // Into a cache by pull (which checks nothing and loads nothing), then offline.
  Store& store = cache();
  hub(store)->pull(Ref::parse(kRef));
  {
    trust::TrustPolicy short_grace;
    short_grace.offline_grace_s = 60;
    Runtime rt;
    add_toy_slots(rt);
    expect_refused([&] { kernelize_with(*hub(store, true, short_grace), keys, rt); }, kRef,
                   "beyond the offline grace period of 1m");
    expect_nothing_loaded(rt, store);
  }
  {
    ::setenv("KERNEL_HUB_OFFLINE_GRACE", "1800", 1);
    Runtime rt;
    add_toy_slots(rt);
    expect_refused(
        [&] { kernelize_with(*hub(store, true, trust::TrustPolicy::from_env()), keys, rt); }, kRef,
        "beyond the offline grace period of 30m");
    expect_nothing_loaded(rt, store);
    ::unsetenv("KERNEL_HUB_OFFLINE_GRACE");
  }
  {
    Runtime rt;
    add_toy_slots(rt);
    KernelizeReport r = kernelize_with(*hub(store, true), keys, rt);  // default grace: 7 days
    expect_loaded(r, rt, store, signed_by(key));
    EXPECT_TRUE(contains(r.find("Scale", Mode::kEval)->trust, "(expired, grace)")) << r.str();
    std::string w = warnings();
    EXPECT_TRUE(contains(w, "test/toy@v1: the signature expired at")) << w;
    EXPECT_TRUE(contains(w, "accepted offline within the grace period of 7d")) << w;
  }
}

// 4d. A replayed older statement: serial 10 loaded, then the tag re-pointed at an older index
// signed with serial 5.
TEST_F(TrustE2E, ReplayedOlderSerialIsRefusedAsRollback) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  Packed old_pack = pack_signed(key, "toy-1.0.0", /*serial=*/5);
  Packed new_pack = pack_signed(key, "toy-2.0.0", /*serial=*/10);
  ASSERT_NE(old_pack.index(), new_pack.index());
  push(old_pack);
  push(new_pack);
  trust::TrustStore keys = trust_keys(key);

  Store& store = cache();
  {
    Runtime rt;
    add_toy_slots(rt);
    KernelizeReport r = kernelize_with(*hub(store), keys, rt);
    EXPECT_EQ(r.find("Scale", Mode::kEval)->package, "toy@2.0.0") << r.str();
    EXPECT_TRUE(contains(r.find("Scale", Mode::kEval)->trust, "serial 10")) << r.str();
    Vec x({1}), y({0});
    ASSERT_EQ(call_scale(rt, "Scale", x, 2, y), KH_OK);
    EXPECT_EQ(y.data[0], 3.0f);  // 2.0.0: x * alpha + 1
  }

  push(old_pack);  // the hub (or a mirror) serves the older, validly signed index again
  const Digest old_layer = old_pack.report.variants.at(0).layer.digest;
  Runtime rt;
  add_toy_slots(rt);
  expect_refused([&] { kernelize_with(*hub(store), keys, rt); }, kRef,
                 "rollback: serial 5 is older than serial 10");
  Vec x({1}), y({0});
  EXPECT_EQ(call_scale(rt, "Scale", x, 2, y), kFallbackStatus);
  EXPECT_EQ(call_scale(rt, "ScaleInfer", x, 2, y), kFallbackStatus);
  // Refused before anything of it was fetched or unpacked (the trust check comes first).
  EXPECT_FALSE(store.unpacked_path(old_layer).has_value());
  EXPECT_FALSE(store.has_blob(old_layer));

  // The state lives with the trust store, not in the cache: a cleared (fresh) cache still
  // refuses serial 5...
  {
    Runtime cleared;
    add_toy_slots(cleared);
    expect_refused([&] { kernelize_fresh(keys, cleared); }, kRef,
                   "rollback: serial 5 is older than serial 10");
    EXPECT_TRUE(stdfs::exists(keys.state_dir()));
    EXPECT_FALSE(stdfs::exists(store.root() / "trust"));
  }
  // ...while a trust store that never saw serial 10 accepts it: the refusal came from the state.
  trust::TrustStore other = trust_keys(key);
  Runtime fresh;
  add_toy_slots(fresh);
  KernelizeReport r;
  Store& clean = kernelize_fresh(other, fresh, {}, &r);
  expect_loaded(r, fresh, clean, signed_by(key));
}

// The cache as a security boundary: an unpacked tree is derived data. A tree whose library was
// replaced together with a kernel.json that lists it (or a tree planted before the first pull)
// is not the kernel.json the signed index names: it is unpacked again from the verified blob, and
// the genuine package is what loads, online and offline; where it cannot be, nothing loads.
TEST_F(TrustE2E, ReplacedOrPlantedUnpackedTreeIsDerivedAgainFromTheBlob) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  Packed p = pack_signed(key);  // toy 1.0.0: y = x * alpha
  push(p);
  trust::TrustStore keys = trust_keys(key);
  const Digest layer = p.report.variants.at(0).layer.digest;
  // The attacker's tree: toy 2.0.0 (y = x * alpha + 1), self-consistent (its own kernel.json).
  Packed evil = pack_unsigned("toy-2.0.0");
  const Digest evil_layer = evil.report.variants.at(0).layer.digest;
  auto plant = [&](const stdfs::path& dir) {
    if (stdfs::exists(dir)) test::remove_tree(dir);
    extract_archive(evil.layout / "blobs/sha256" / evil_layer.hex, dir, ArchiveLimits{});
  };
  auto expect_genuine = [&](Runtime& rt, const KernelizeReport& r) {
    SCOPED_TRACE(r.str());
    EXPECT_EQ(r.find("Scale", Mode::kEval)->package, "toy@1.0.0");
    Vec x({1, -2}), y({0, 0});
    ASSERT_EQ(call_scale(rt, "Scale", x, 3, y), KH_OK);
    EXPECT_EQ(y.data, (std::vector<float>{3, -6}));  // 2.0.0 would give {4, -5}
  };

  Store& store = cache();
  {
    Runtime rt;
    add_toy_slots(rt);
    expect_genuine(rt, kernelize_with(*hub(store), keys, rt));
  }
  auto dir = store.unpacked_path(layer);
  ASSERT_TRUE(dir.has_value());
  for (bool offline : {false, true}) {
    plant(*dir);
    Runtime rt;
    add_toy_slots(rt);
    expect_genuine(rt, kernelize_with(*hub(store, offline), keys, rt));
  }

  // Planted before the first pull: online, the blob is fetched and the tree derived from it.
  Store& planted = cache();
  plant(planted.root() / "unpacked" / layer.hex);
  {
    Runtime rt;
    add_toy_slots(rt);
    expect_genuine(rt, kernelize_with(*hub(planted), keys, rt));
  }
  // Offline with no blob to derive it from: refused, nothing loaded.
  Store& stranded = cache();
  hub(stranded)->pull(Ref::parse(kRef));
  plant(stranded.root() / "unpacked" / layer.hex);
  fs::remove_tree(stranded.blob_path(layer));
  registry_.stop();
  Runtime rt;
  add_toy_slots(rt);
  expect_refused([&] { kernelize_with(*hub(stranded, true), keys, rt); }, kRef,
                 "could not be unpacked again", ErrorKind::kIntegrity);
  expect_nothing_loaded(rt, stranded);
}

// 4e. Unsigned: refused under the default policy; allowed with a warning by allow_unsigned.
TEST_F(TrustE2E, UnsignedRefusedByDefaultAllowedWithAWarning) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  Packed p = pack_unsigned();
  PushReport pushed = push(p);
  EXPECT_EQ(pushed.signatures_pushed, 0u);
  trust::TrustStore keys = trust_keys(key);
  {
    Runtime rt;
    add_toy_slots(rt);
    std::string msg = expect_refused([&] { kernelize_fresh(keys, rt); }, kRef,
                                     "not signed (no signature for index " + p.index().str());
    EXPECT_TRUE(contains(msg, "KERNEL_HUB_ALLOW_UNSIGNED=1")) << msg;
    expect_nothing_loaded(rt, *stores_.back());
  }
  EXPECT_TRUE(warnings().empty()) << warnings();
  trust::TrustPolicy allow;
  allow.allow_unsigned = true;
  Runtime rt;
  add_toy_slots(rt);
  KernelizeReport r;
  Store& store = kernelize_fresh(keys, rt, allow, &r);
  expect_loaded(r, rt, store, "UNSIGNED (allowed)");
  std::string w = warnings();
  EXPECT_TRUE(contains(w, "loading UNSIGNED package test/toy@v1")) << w;
}

// The layout hub directory: pack --sign writes the sidecar next to the layout; loads verify it,
// and a tampered sidecar or blob is refused.
TEST_F(TrustE2E, LayoutHubSidecarSignature) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  const TempDir& hub_dir = temp("kh-trust-hub");
  PackOptions o;
  o.package_dir = toy_package("toy-1.0.0");
  o.output = hub_dir.path();
  o.repo = kRepo;
  o.devices = {"cpu"};
  o.sms = {};
  o.tags = {"v1"};
  o.sign_key = &key;
  PackReport pr = pack_package(o);
  const Digest index = pr.index.digest;
  stdfs::path sidecar = hub_dir / (std::string(kRepo) + "/" + signature_sidecar_rel(index));
  ASSERT_TRUE(stdfs::is_regular_file(sidecar));
  trust::TrustStore keys = trust_keys(key);
  auto layout_hub = [&](Store& s) {
    return std::make_unique<Hub>(HubAddress::parse(hub_dir.path().string(), false), s, options());
  };

  {
    Store& store = cache();
    Runtime rt;
    add_toy_slots(rt);
    KernelizeReport r = kernelize_with(*layout_hub(store), keys, rt);
    expect_loaded(r, rt, store, signed_by(key));
  }
  {
    // Untrusted for this repo through the layout as well.
    Store& store = cache();
    Runtime rt;
    add_toy_slots(rt);
    trust::TrustStore other = trust_keys(trust::PrivateKey::generate());
    expect_refused([&] { kernelize_with(*layout_hub(store), other, rt); }, kRef,
                   "which is not trusted");
    expect_nothing_loaded(rt, store);
  }

  std::string good = fs::read_file(sidecar, 1 << 20);
  {
    trust::SignatureSet set = trust::SignatureSet::parse(good, "sidecar");
    for (auto& e : set.envelopes) e.sigs[0].second[0] ^= 0x40;
    fs::write_file_atomic(sidecar, set.serialize(), 0644);
    Store& store = cache();
    Runtime rt;
    add_toy_slots(rt);
    expect_refused([&] { kernelize_with(*layout_hub(store), keys, rt); }, kRef,
                   "bad signature by key");
    expect_nothing_loaded(rt, store);
  }
  {
    stdfs::remove(sidecar);
    Store& store = cache();
    Runtime rt;
    add_toy_slots(rt);
    expect_refused([&] { kernelize_with(*layout_hub(store), keys, rt); }, kRef, "not signed");
    expect_nothing_loaded(rt, store);
  }
  fs::write_file_atomic(sidecar, good, 0644);
  {
    // The package layer in the layout's blobs.
    const Digest layer = pr.variants.at(0).layer.digest;
    flip_byte(hub_dir / (std::string(kRepo) + "/blobs/sha256/" + layer.hex), 7);
    Store& store = cache();
    Runtime rt;
    add_toy_slots(rt);
    expect_refused([&] { kernelize_with(*layout_hub(store), keys, rt); }, kRef,
                   layer.str() + ": blob digest mismatch", kLayerMismatchKind);
    expect_nothing_loaded(rt, store);
  }
}

// 5. The CLI as a child process: keygen, trust add/ls, sign on the registry, pull, trust rm.
TEST_F(TrustE2E, CliKeygenTrustSignPull) {
  const TempDir& work = temp("kh-trust-cli");
  const stdfs::path trust_dir = work / "trust";
  const stdfs::path cache_dir = work / "cache";
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {cli_path(), "--plain-http", "--hub", registry_.oci_url()};
    argv.insert(argv.end(), args.begin(), args.end());
    Env env = {{"KERNEL_HUB_TRUST_DIR", trust_dir.string()},
               {"KERNEL_HUB_CACHE", cache_dir.string()},
               {"KERNEL_HUB_BACKOFF_S", "0.05"},
               {"KERNEL_HUB_ALLOW_UNSIGNED", "\x01"},
               {"KERNEL_HUB_OFFLINE_GRACE", "\x01"},
               {"KERNEL_HUB_OFFLINE", "\x01"},
               {"KERNEL_HUB_ENDPOINT", "\x01"}};
    return run_process(argv, env, 120);
  };
  Packed p = pack_unsigned();
  push(p);

  // keygen: the private key 0600, K.pub beside it, the keyid printed.
  const std::string k = (work / "K").string();
  ProcessResult gen = cli({"keygen", "-o", k});
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  struct stat st {};
  ASSERT_EQ(::stat(k.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_TRUE(stdfs::is_regular_file(k + ".pub"));
  const std::string keyid = trust::PublicKey::load(k + ".pub").key_id();
  EXPECT_EQ(trust::PrivateKey::load(k).public_key().key_id(), keyid);
  EXPECT_TRUE(contains(gen.out, keyid)) << gen.out;
  ProcessResult again = cli({"keygen", "-o", k});  // never replaces a key
  EXPECT_NE(again.exit_code, 0);
  ProcessResult gen_json = cli({"--json", "keygen", "-o", (work / "K2").string()});
  ASSERT_EQ(gen_json.exit_code, 0) << gen_json.err;
  auto gj = nlohmann::json::parse(gen_json.out);
  EXPECT_EQ(gj["public_key"], (work / "K2").string() + ".pub");
  EXPECT_EQ(gj["keyid"], trust::PublicKey::load(work / "K2.pub").key_id());

  // trust add / ls --json.
  ProcessResult add = cli({"trust", "add", k + ".pub", "--for", "test/*"});
  ASSERT_EQ(add.exit_code, 0) << add.err;
  EXPECT_TRUE(contains(add.out, keyid)) << add.out;
  ProcessResult ls = cli({"--json", "trust", "ls"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  auto lj = nlohmann::json::parse(ls.out);
  EXPECT_EQ(lj["dir"], trust_dir.string());
  EXPECT_TRUE(lj["problems"].empty()) << ls.out;
  bool listed = false;
  for (auto& e : lj["keys"]) {
    if (e["keyid"] != keyid) continue;
    listed = true;
    EXPECT_EQ(e["repos"], nlohmann::json::array({"test/*"}));
    EXPECT_FALSE(e["builtin"].get<bool>());
    EXPECT_GT(e["added_at"].get<int64_t>(), 0);
    EXPECT_TRUE(stdfs::is_regular_file(e["path"].get<std::string>()));
  }
  EXPECT_TRUE(listed) << ls.out;

  // Before signing: pull caches it and warns that loading will be refused.
  ProcessResult unsigned_pull = cli({"pull", kRef});
  ASSERT_EQ(unsigned_pull.exit_code, 0) << unsigned_pull.err;
  EXPECT_TRUE(contains(unsigned_pull.err, "refused: not signed")) << unsigned_pull.err;

  // sign on the registry.
  ProcessResult sign = cli({"--json", "sign", "--key", k, kRef});
  ASSERT_EQ(sign.exit_code, 0) << sign.err;
  auto sj = nlohmann::json::parse(sign.out);
  EXPECT_EQ(sj["ref"], kRef);
  EXPECT_EQ(sj["index"], p.index().str());
  EXPECT_EQ(sj["keyid"], keyid);
  EXPECT_GT(sj["serial"].get<uint64_t>(), 0u);
  EXPECT_TRUE(trust::parse_time_rfc3339(sj["expires"].get<std::string>()).has_value()) << sign.out;
  EXPECT_FALSE(sj["hub_id"].get<std::string>().empty());

  // pull: signed by the key.
  ProcessResult pull = cli({"pull", kRef});
  ASSERT_EQ(pull.exit_code, 0) << pull.err;
  EXPECT_TRUE(contains(pull.out, "signed by key " + keyid)) << pull.out << pull.err;
  ProcessResult pull_json = cli({"--json", "pull", kRef});
  ASSERT_EQ(pull_json.exit_code, 0) << pull_json.err;
  auto pj = nlohmann::json::parse(pull_json.out);
  ASSERT_EQ(pj.size(), 1u) << pull_json.out;
  EXPECT_EQ(pj[0]["trust"]["status"], "signed") << pull_json.out;
  EXPECT_EQ(pj[0]["trust"]["keyid"], keyid);
  EXPECT_EQ(pj[0]["trust"]["serial"], sj["serial"]);

  // trust rm by prefix, then pull warns of the refusal.
  ProcessResult rm = cli({"--json", "trust", "rm", keyid.substr(0, 12)});
  ASSERT_EQ(rm.exit_code, 0) << rm.err;
  EXPECT_EQ(nlohmann::json::parse(rm.out)["removed"], keyid);
  ProcessResult ls2 = cli({"--json", "trust", "ls"});
  for (auto& e : nlohmann::json::parse(ls2.out)["keys"]) EXPECT_NE(e["keyid"], keyid);
  ProcessResult refused = cli({"pull", kRef});
  EXPECT_EQ(refused.exit_code, 0) << refused.err;  // pull only caches; loading is refused
  EXPECT_FALSE(contains(refused.out, "signed by key")) << refused.out;
  EXPECT_TRUE(contains(refused.err,
                       "warning: test/toy@v1: refused: signature by key " + keyid.substr(0, 16)))
      << refused.err;
  EXPECT_TRUE(contains(refused.err, "loading it will be refused")) << refused.err;
  ProcessResult refused_json = cli({"--json", "pull", kRef});
  auto rj = nlohmann::json::parse(refused_json.out);
  EXPECT_EQ(rj[0]["trust"]["status"], "refused") << refused_json.out;
  EXPECT_TRUE(contains(rj[0]["trust"]["message"].get<std::string>(), kRef));
}

}  // namespace
}  // namespace kh::test
