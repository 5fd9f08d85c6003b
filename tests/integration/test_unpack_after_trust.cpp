// Unpacking is derived data made after the trust check, within a budget per command: pull caches
// blobs and unpacks nothing; kernelize checks each chosen index's signature before it fetches or
// unpacks its variant (a refused index leaves unpacked/ empty, also when the blobs are cached);
// an older index without kernelhub.layers is trusted first and then unpacked to read kernel.json;
// the unpack budget (KERNEL_HUB_UNPACK_BUDGET) covers a whole kernelize call. On layout hubs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "hub/base/clock.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/transport/source.h"
#include "registry/kernelize.h"
#include "tests/fixtures/process.h"
#include "tests/unit/test_kernelize_util.h"

namespace kh::test {
namespace {

namespace stdfs = std::filesystem;

// Every entry of unpacked/, hidden temp trees included.
std::vector<std::string> unpacked_entries(const Store& store) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : stdfs::directory_iterator(store.root() / "unpacked", ec))
    out.push_back(e.path().filename().string());
  return out;
}

void expect_error(const std::function<void()>& f, ErrorKind kind,
                  const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << n << " not in: " << e.what();
  }
}

// An index as pack wrote it before kernelhub.layers and kernelhub.package-manifest.
void as_packed_before_the_annotations(oci::Index& index) {
  for (auto& d : index.manifests) {
    d.annotations.erase(std::string(kAnnotationLayers));
    d.annotations.erase(std::string(kAnnotationPackageManifest));
  }
}

class UnpackAfterTrust : public ::testing::Test {
 protected:
  void SetUp() override { layer_ = pack_toy_hub(hub_dir_.path()).variants.at(0).layer.digest; }

  std::unique_ptr<Hub> hub(Store& store, HubOptions o = {}) {
    o.progress = false;
    return std::make_unique<Hub>(HubAddress::parse(hub_dir_.path().string(), false), store, o);
  }
  KernelizeReport kernelize_toy(Hub& h, Runtime& rt, const trust::TrustStore* keys = nullptr) {
    add_slots(rt, {"Scale", "ScaleInfer"});
    KernelizeOptions o;
    o.trust_keys = keys;
    return kernelize(rt, config_, h, local_cpu_device(), o);
  }
  // Moves v1 to its index as `edit` leaves it, signed by the test publisher or not at all.
  void republish_v1(const std::function<void(oci::Index&)>& edit, bool sign) {
    auto src = open_layout_source(HubAddress::parse(hub_dir_.path().string(), false), {});
    oci::Index index = oci::parse_index(src->get_manifest("test/toy", "v1").bytes);
    edit(index);
    std::string bytes = oci::serialize(index);
    oci::Descriptor desc = oci::describe(bytes, oci::kMediaTypeIndex);
    src->push_manifest("test/toy", desc.digest.str(), bytes, oci::kMediaTypeIndex);
    if (sign) {
      trust::Statement st;
      st.hub_id = "kernel-hub";
      st.repo = "test/toy";
      st.tag = "v1";
      st.index = desc.digest;
      st.serial = static_cast<uint64_t>(unix_now()) + 1;
      st.expires = unix_now() + 3600;
      src->push_signature("test/toy", desc, trust::sign_statement(st, test_publisher()));
    }
    src->push_manifest("test/toy", "v1", bytes, oci::kMediaTypeIndex);
  }

  TempDir hub_dir_{"kh-hub"};
  TempDir cache_{"kh-cache"};
  TempDir keys_dir_{"kh-keys"};
  Store store_{cache_.path()};
  KernelConfig config_ = KernelConfig::parse(toy_config("test/toy"));
  Digest layer_;
};

TEST_F(UnpackAfterTrust, PullCachesEveryBlobAndUnpacksNothing) {
  PullReport r = hub(store_)->pull(Ref::parse("test/toy@v1"));
  EXPECT_TRUE(r.kernel_index);
  EXPECT_GT(r.blobs_downloaded, 0u);
  EXPECT_TRUE(store_.has_blob(layer_));
  EXPECT_TRUE(unpacked_entries(store_).empty());
  // The tree is made when the package is used, after its trust check.
  Runtime rt;
  KernelizeReport k = kernelize_toy(*hub(store_), rt);
  EXPECT_EQ(k.find("Scale", Mode::kEval)->source, BindingSource::kCache) << k.str();
  EXPECT_EQ(unpacked_entries(store_), std::vector<std::string>{layer_.hex});
}

// Keys that trust nobody refuse the index: nothing of it is unpacked, whether its blobs had to be
// fetched (they are not) or were cached by an earlier pull.
TEST_F(UnpackAfterTrust, ARefusedSignatureLeavesNothingUnpacked) {
  trust::TrustStore nobody = trust::TrustStore::open(keys_dir_.path());
  {
    Runtime rt;
    expect_error([&] { kernelize_toy(*hub(store_), rt, &nobody); }, ErrorKind::kRefused,
                 {"test/toy"});
    EXPECT_TRUE(unpacked_entries(store_).empty());
    EXPECT_FALSE(store_.has_blob(layer_)) << "the variant was fetched before its trust check";
    Vec x({1}), y({0});
    EXPECT_EQ(call_scale(rt, "Scale", x, 2, y), kFallbackStatus);
  }
  hub(store_)->pull(Ref::parse("test/toy@v1"));
  ASSERT_TRUE(store_.has_blob(layer_));
  Runtime rt;
  expect_error([&] { kernelize_toy(*hub(store_), rt, &nobody); }, ErrorKind::kRefused,
               {"test/toy"});
  EXPECT_TRUE(unpacked_entries(store_).empty());
}

// An index packed before kernelhub.layers: the plan learns the variant's layers from kernel.json,
// which needs the tree, so the index is trusted first and unpacked after. Unsigned, it is refused
// with nothing unpacked, and allowed (with its re-plan) under KERNEL_HUB_ALLOW_UNSIGNED.
TEST_F(UnpackAfterTrust, AnOldIndexIsTrustedBeforeItIsUnpackedToReadKernelJson) {
  republish_v1(as_packed_before_the_annotations, /*sign=*/false);
  {
    Runtime rt;
    expect_error([&] { kernelize_toy(*hub(store_), rt); }, ErrorKind::kRefused, {"test/toy"});
    EXPECT_TRUE(unpacked_entries(store_).empty());
  }
  HubOptions allow;
  allow.trust.allow_unsigned = true;
  Runtime rt;
  KernelizeReport r = kernelize_toy(*hub(store_, allow), rt);
  const KernelizeBinding* scale = r.find("Scale", Mode::kTrain);
  EXPECT_EQ(scale->source, BindingSource::kHub) << r.str();
  EXPECT_EQ(scale->trust, "UNSIGNED (allowed)");
  // The second plan read the unpacked kernel.json: ScaleInfer has no backward op.
  EXPECT_EQ(r.find("ScaleInfer", Mode::kEval)->resolution.layers_from, LayersSource::kPackage);
  EXPECT_EQ(r.find("ScaleInfer", Mode::kTrain)->source, BindingSource::kFallback) << r.str();
  EXPECT_EQ(unpacked_entries(store_), std::vector<std::string>{layer_.hex});
}

// A signed index packed before kernelhub.package-manifest names no kernel.json digest: the tree is
// still held to the signed layer (kernel.json's digest read from the verified blob), so a
// self-consistent tree planted at unpacked/<layer> (toy 2.0.0: y = x * alpha + 1) is unpacked
// again from the blob, and toy 1.0.0 is what loads.
TEST_F(UnpackAfterTrust, AnOldSignedIndexHoldsAPlantedTreeToItsLayer) {
  republish_v1(as_packed_before_the_annotations, /*sign=*/true);
  hub(store_)->pull(Ref::parse("test/toy@v1"));
  const stdfs::path dir = store_.root() / "unpacked" / layer_.hex;
  stdfs::create_directories(dir.parent_path());
  stdfs::copy(toy_package("toy-2.0.0"), dir, stdfs::copy_options::recursive);
  Runtime rt;
  KernelizeReport r = kernelize_toy(*hub(store_), rt);
  EXPECT_EQ(r.find("Scale", Mode::kEval)->package, "toy@1.0.0") << r.str();
  Vec x({1, -2}), y({0, 0});
  ASSERT_EQ(call_scale(rt, "Scale", x, 3, y), KH_OK);
  EXPECT_EQ(y.data, (std::vector<float>{3, -6})) << "the planted toy 2.0.0 was loaded";
}

// One budget for everything a kernelize call unpacks: over it, kRefused naming the layer, the
// budget and the variable; the partial tree is gone and nothing is loaded.
TEST_F(UnpackAfterTrust, TheUnpackBudgetCoversAKernelizeCall) {
  HubOptions tight;
  tight.unpack_budget = 1000;  // the toy's library alone is larger
  Runtime rt;
  expect_error([&] { kernelize_toy(*hub(store_, tight), rt); }, ErrorKind::kRefused,
               {layer_.str(), "budget of 1000 bytes", "KERNEL_HUB_UNPACK_BUDGET"});
  EXPECT_TRUE(unpacked_entries(store_).empty());
  Vec x({1}), y({0});
  EXPECT_EQ(call_scale(rt, "Scale", x, 2, y), kFallbackStatus);

  // The variable sets it; the default unpacks the toy.
  ::setenv("KERNEL_HUB_UNPACK_BUDGET", "1000", 1);
  EXPECT_EQ(HubOptions::from_env().unpack_budget, 1000u);
  ::unsetenv("KERNEL_HUB_UNPACK_BUDGET");
  EXPECT_EQ(HubOptions::from_env().unpack_budget, UnpackBudget::kDefault);
  Runtime ok;
  KernelizeReport r = kernelize_toy(*hub(store_), ok);
  EXPECT_EQ(r.find("Scale", Mode::kEval)->source, BindingSource::kCache) << r.str();
  EXPECT_EQ(unpacked_entries(store_), std::vector<std::string>{layer_.hex});
}

}  // namespace
}  // namespace kh::test
