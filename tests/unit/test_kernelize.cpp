// pack and kernelize without a server: packing is reproducible, refuses what the loader refuses
// and writes what the resolver reads; kernelize binds from a layout hub directory, serves
// KERNEL_HUB_LOCAL packages, honours KERNEL_HUB_DISABLE, strict and the ref TTL.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

#include "hub/base/clock.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/transport/source.h"
#include "loader/nvrtc.h"
#include "registry/kernelize.h"
#include "registry/package_manifest.h"
#include "tests/fixtures/process.h"
#include "tests/unit/test_kernelize_util.h"

namespace kh::test {
namespace {

bool have_nvrtc() {
  try {
    nvrtc();
    return true;
  } catch (const Error&) {
    return false;
  }
}

oci::Index layout_index(const std::filesystem::path& layout, const std::string& tag) {
  auto src = open_single_layout_source(layout, {});
  FetchedManifest m = src->get_manifest("", tag);
  return oci::parse_index(m.bytes);
}

TEST(Pack, SameInputsGiveTheSameDigests) {
  TempDir tmp;
  std::vector<std::string> devices = {"cpu"};
  std::vector<std::string> sms;
  if (have_nvrtc()) {
    devices = {"cuda", "cpu"};
    sms = {"80", "90a", "90"};
  }
  PackReport a = pack_toy("toy-1.0.0", tmp / "a", devices, sms);
  PackReport b = pack_toy("toy-1.0.0", tmp / "b", devices, sms);
  EXPECT_EQ(a.index.digest, b.index.digest);
  ASSERT_EQ(a.variants.size(), devices.size());
  for (size_t i = 0; i < a.variants.size(); ++i) {
    EXPECT_EQ(a.variants[i].layer.digest, b.variants[i].layer.digest);
    EXPECT_EQ(a.variants[i].entry.digest, b.variants[i].entry.digest);
  }
  EXPECT_EQ(a.tags, (std::vector<std::string>{"v1", "1.0.0"}));
  // Both tags name the same index, which has no top-level artifactType (skopeo 1.9.3).
  oci::Index v1 = layout_index(tmp / "a", "v1");
  EXPECT_EQ(oci::serialize(v1), oci::serialize(layout_index(tmp / "a", "1.0.0")));
  EXPECT_TRUE(v1.artifact_type.empty());
  ASSERT_EQ(v1.manifests.size(), devices.size());
  const auto& cpu = v1.manifests.back();
  EXPECT_EQ(cpu.annotations.at("kernelhub.device"), "cpu");
  EXPECT_EQ(cpu.annotations.at("kernelhub.abi"),
            std::to_string(KH_ABI_MAJOR) + "." + std::to_string(KH_ABI_MINOR));
  EXPECT_EQ(cpu.platform->os, "linux");
  if (devices.size() == 2) {
    const auto& cuda = v1.manifests.front();
    EXPECT_EQ(cuda.annotations.at("kernelhub.cuda.sm"), "80,90,90a");
    EXPECT_EQ(cuda.annotations.at("kernelhub.source"), "true");
    EXPECT_EQ(cuda.annotations.at("kernelhub.cuda.version"), nvrtc().version.str());
    // The resolver reads what pack wrote: sm_90 gets the exact 90a cubin, sm_86 the 80 one,
    // sm_75 the source.
    auto pick = [&](int sm) {
      Device d;
      d.key = "cuda";
      d.sm = sm;
      d.cuda_major = nvrtc().version.major;
      d.cuda_minor = nvrtc().version.minor;
      d.arch = local_arch();
      auto sel = select_variant(v1, d, {});
      EXPECT_TRUE(sel.chosen.has_value()) << sm;
      return sel.chosen ? sel.chosen->code : VariantCode::kHost;
    };
    EXPECT_EQ(pick(90), VariantCode::kCubinExact);
    EXPECT_EQ(pick(86), VariantCode::kCubinCompatible);
    EXPECT_EQ(pick(75), VariantCode::kNvrtcSource);
  }
  auto sel = select_variant(v1, local_cpu_device(), {});
  ASSERT_TRUE(sel.chosen.has_value());
  EXPECT_EQ(sel.chosen->descriptor.annotations.at("kernelhub.device"), "cpu");
}

TEST(Pack, WritesARegistryManifestWithEveryFileDigest) {
  TempDir tmp;
  PackReport r = pack_toy("toy-1.0.0", tmp / "l");
  ASSERT_EQ(r.variants.size(), 1u);
  Store store(tmp / "cache");
  std::string blob = fs::read_file(tmp / "l" / "blobs" / "sha256" / r.variants[0].layer.digest.hex);
  store.put_blob(r.variants[0].layer, blob);
  auto dir = store.unpack(r.variants[0].layer.digest);
  PackageManifest m = read_package_manifest(dir);
  EXPECT_EQ(m.name, "toy");
  EXPECT_EQ(m.version, "1.0.0");
  EXPECT_EQ(m.device, "cpu");
  EXPECT_TRUE(m.layers.at("Scale").has_backward);
  EXPECT_FALSE(m.layers.at("ScaleInfer").has_backward);
  EXPECT_EQ(m.files.size(), 1u);  // libtoy.so; the cpu variant carries no device code
  EXPECT_NO_THROW(verify_package_files(dir, m));
}

TEST(Pack, CarriesEachVariantsLayersInTheIndex) {
  TempDir tmp;
  PackReport r = pack_toy("toy-1.0.0", tmp / "l");
  oci::Index v1 = layout_index(tmp / "l", "v1");
  ASSERT_EQ(v1.manifests.size(), 1u);
  const oci::Descriptor& entry = v1.manifests[0];
  const std::string& text = entry.annotations.at(std::string(kAnnotationLayers));
  auto layers = parse_package_layers(text, "kernelhub.layers");
  // What the package's kernel.json says, in one line.
  Store store(tmp / "cache");
  store.put_blob(r.variants[0].layer,
                 fs::read_file(tmp / "l" / "blobs" / "sha256" / r.variants[0].layer.digest.hex));
  EXPECT_EQ(layers, read_package_manifest(store.unpack(r.variants[0].layer.digest)).layers);
  EXPECT_TRUE(layers.at("Scale").has_backward);
  EXPECT_FALSE(layers.at("ScaleInfer").has_backward);
  EXPECT_EQ(text.find('\n'), std::string::npos) << text;
  // The variant manifest carries it too.
  auto src = open_single_layout_source(tmp / "l", {});
  oci::Manifest m = oci::parse_manifest(src->get_manifest("", entry.digest.str()).bytes);
  EXPECT_EQ(m.annotations.at(std::string(kAnnotationLayers)), text);
}

TEST(Pack, RefusesTheLibraryTheLoaderRefuses) {
  TempDir tmp;
  try {
    pack_toy("toy-cudart", tmp / "l");
    FAIL() << "packed a library that needs libcudart";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused);
    EXPECT_NE(std::string(e.what()).find("needed-libraries"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("libcudart.so.13"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(tmp / "l" / "index.json"));
  EXPECT_THROW(pack_toy("toy-no-entry", tmp / "l2"), Error);
}

TEST(Pack, RejectsBadInputsBeforeWriting) {
  TempDir tmp;
  PackOptions o;
  o.package_dir = toy_package("toy-1.0.0");
  o.output = tmp / "l";
  o.devices = {"tpu"};
  EXPECT_THROW(pack_package(o), Error);
  o.devices = {"cuda"};
  o.sms = {"nine"};
  EXPECT_THROW(pack_package(o), Error);
  o.devices = {"cpu"};
  o.tags = {"bad tag"};
  EXPECT_THROW(pack_package(o), Error);
  o.tags = {};
  o.package_dir = tmp / "missing";
  EXPECT_THROW(pack_package(o), Error);
  // A cuda variant with no device code: the hint names the flag that exists (--devices).
  o.package_dir = toy_package("toy-no-device-code");
  o.devices = {"cuda", "cpu"};
  o.sms = {"90"};
  try {
    pack_package(o);
    FAIL() << "packed a cuda variant without device code";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(--devices cpu)"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(tmp / "l" / "index.json"));
}

TEST(KernelizeParse, LocalOverridesAndDeviceTargets) {
  auto m = parse_local_overrides("org/a=/p/a,org/b=/p/b");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.at("org/b"), "/p/b");
  EXPECT_THROW(parse_local_overrides("org/a:/p/a"), Error);
  EXPECT_THROW(parse_local_overrides("Bad Repo=/x"), Error);
  EXPECT_EQ(parse_device_target("cpu"), local_cpu_device());
  Device d = parse_device_target("cuda:sm_90:cuda_13.0");
  EXPECT_EQ(d.sm, 90);
  EXPECT_EQ(d.cuda_major, 13);
  EXPECT_EQ(parse_device_target("cuda:sm_80:cuda_12.4:linux/arm64").arch, "arm64");
  EXPECT_THROW(parse_device_target("gpu"), Error);
}

// A layout hub directory holding test/toy (v1 = 1.0.0), cpu variant.
class KernelizeLayout : public ::testing::Test {
 protected:
  void SetUp() override { pack_toy_hub(hub_dir_.path()); }
  Hub hub(HubOptions o = {}) {
    o.progress = false;
    return Hub(HubAddress::parse(hub_dir_.path().string(), false), store_, o);
  }
  // Moves v1 to its index as `edit` leaves it (what an older or a faulty packer wrote), signed
  // by the test publisher.
  void republish_v1(const std::function<void(oci::Index&)>& edit) {
    auto hub_source = open_layout_source(HubAddress::parse(hub_dir_.path().string(), false), {});
    oci::Index index = oci::parse_index(hub_source->get_manifest("test/toy", "v1").bytes);
    edit(index);
    std::string bytes = oci::serialize(index);
    oci::Descriptor desc = oci::describe(bytes, oci::kMediaTypeIndex);
    hub_source->push_manifest("test/toy", desc.digest.str(), bytes, oci::kMediaTypeIndex);
    trust::Statement st;
    st.hub_id = "kernel-hub";
    st.repo = "test/toy";
    st.tag = "v1";
    st.index = desc.digest;
    st.serial = static_cast<uint64_t>(unix_now()) + ++republished_;
    st.expires = unix_now() + 3600;
    hub_source->push_signature("test/toy", desc, trust::sign_statement(st, test_publisher()));
    hub_source->push_manifest("test/toy", "v1", bytes, oci::kMediaTypeIndex);
  }

  TempDir hub_dir_{"kh-hub"};
  TempDir cache_{"kh-cache"};
  Store store_{cache_.path()};
  KernelConfig config_ = KernelConfig::parse(toy_config("test/toy"));
  int republished_ = 0;
};

TEST_F(KernelizeLayout, BindsBothModesAndSwaps) {
  Runtime rt;
  add_slots(rt, {"Scale", "ScaleInfer", "Unmapped"});
  Hub h = hub();
  KernelizeReport r = kernelize(rt, config_, h, local_cpu_device(), {});
  ASSERT_EQ(r.bindings.size(), 6u) << r.str();
  EXPECT_EQ(r.fetched, 1u);
  EXPECT_EQ(r.find("Scale", Mode::kEval)->source, BindingSource::kHub) << r.str();
  EXPECT_EQ(r.find("Scale", Mode::kTrain)->source, BindingSource::kHub);
  EXPECT_EQ(r.find("ScaleInfer", Mode::kEval)->package, "toy@1.0.0");
  // ScaleInfer has no backward op: the re-resolution with the package's kernel.json falls
  // through the mode chain to the runtime's fallback.
  EXPECT_EQ(r.find("ScaleInfer", Mode::kTrain)->source, BindingSource::kFallback) << r.str();
  EXPECT_EQ(r.find("Unmapped", Mode::kEval)->source, BindingSource::kFallback);

  Vec x({1, 2, 3}), y({0, 0, 0});
  rt.set_mode(Mode::kEval);
  ASSERT_EQ(call_scale(rt, "ScaleInfer", x, 2.0, y), KH_OK);
  EXPECT_EQ(y.data, (std::vector<float>{2, 4, 6}));
  rt.set_mode(Mode::kTrain);
  EXPECT_EQ(call_scale(rt, "ScaleInfer", x, 2.0, y), kFallbackStatus);
  ASSERT_EQ(call_scale(rt, "Scale", x, 3.0, y, /*backward=*/true), KH_OK);
  EXPECT_EQ(y.data, (std::vector<float>{3, 6, 9}));
  EXPECT_EQ(call_scale(rt, "Unmapped", x, 3.0, y), kFallbackStatus);

  // Again in a fresh runtime: everything from the cache.
  Runtime rt2;
  add_slots(rt2, {"Scale", "ScaleInfer"});
  KernelizeReport again = kernelize(rt2, config_, h, local_cpu_device(), {});
  EXPECT_EQ(again.fetched, 0u);
  EXPECT_EQ(again.find("Scale", Mode::kEval)->source, BindingSource::kCache);
}

TEST_F(KernelizeLayout, ResolvesInOnePassFromTheIndexAnnotation) {
  Runtime rt;
  add_slots(rt, {"Scale", "ScaleInfer"});
  Hub h = hub();
  KernelizeReport r = kernelize(rt, config_, h, local_cpu_device(), {});
  EXPECT_EQ(r.fetched, 1u);
  // Every binding was decided by the first plan (a second one would have read kernel.json).
  for (auto& b : r.bindings) {
    if (!b.resolution.fallback) {
      EXPECT_EQ(b.resolution.layers_from, LayersSource::kIndexAnnotation) << b.layer << r.str();
    }
  }
  const KernelizeBinding* infer = r.find("ScaleInfer", Mode::kTrain);
  EXPECT_EQ(infer->source, BindingSource::kFallback);
  EXPECT_NE(format_trace(infer->resolution).find("layer ScaleInfer has no backward op"),
            std::string::npos)
      << format_trace(infer->resolution);
}

TEST_F(KernelizeLayout, AnIndexWithoutLayersIsPlannedAgainOnceFetched) {
  republish_v1([](oci::Index& index) {
    for (auto& d : index.manifests) d.annotations.erase(std::string(kAnnotationLayers));
  });
  Runtime rt;
  add_slots(rt, {"Scale", "ScaleInfer"});
  Hub h = hub();
  KernelizeReport r = kernelize(rt, config_, h, local_cpu_device(), {});
  EXPECT_EQ(r.fetched, 1u);
  EXPECT_EQ(r.find("Scale", Mode::kTrain)->source, BindingSource::kHub) << r.str();
  // The second plan read the fetched kernel.json: ScaleInfer has no backward op.
  const KernelizeBinding* infer = r.find("ScaleInfer", Mode::kTrain);
  EXPECT_EQ(infer->source, BindingSource::kFallback) << r.str();
  EXPECT_EQ(r.find("ScaleInfer", Mode::kEval)->resolution.layers_from, LayersSource::kPackage);
  EXPECT_NE(format_trace(infer->resolution).find("layer ScaleInfer has no backward op"),
            std::string::npos)
      << format_trace(infer->resolution);
  Vec x({1}), y({0});
  rt.set_mode(Mode::kTrain);
  EXPECT_EQ(call_scale(rt, "ScaleInfer", x, 2.0, y), kFallbackStatus);

  // An annotation that does not parse is ignored the same way (the resolver tests check its
  // trace step): the second plan reads the fetched kernel.json.
  republish_v1([](oci::Index& index) {
    for (auto& d : index.manifests)
      d.annotations[std::string(kAnnotationLayers)] = "{\"Scale\": 1}";
  });
  TempDir cache("kh-cache");
  Store fresh(cache.path());
  HubOptions quiet;
  quiet.progress = false;
  Hub h2(HubAddress::parse(hub_dir_.path().string(), false), fresh, quiet);
  Runtime rt2;
  add_slots(rt2, {"ScaleInfer"});
  KernelizeReport r2 = kernelize(rt2, config_, h2, local_cpu_device(), {});
  EXPECT_EQ(r2.fetched, 1u);
  EXPECT_EQ(r2.find("ScaleInfer", Mode::kTrain)->source, BindingSource::kFallback) << r2.str();
  EXPECT_EQ(r2.find("ScaleInfer", Mode::kEval)->source, BindingSource::kHub) << r2.str();
  EXPECT_EQ(r2.find("ScaleInfer", Mode::kEval)->resolution.layers_from, LayersSource::kPackage);
}

TEST_F(KernelizeLayout, AnIndexWhoseLayersDisagreeWithThePackageIsRefused) {
  // The index claims ScaleInfer has a backward op; the package's kernel.json says it has none.
  republish_v1([](oci::Index& index) {
    for (auto& d : index.manifests) {
      auto layers = parse_package_layers(d.annotations.at(std::string(kAnnotationLayers)), "t");
      layers.at("ScaleInfer").has_backward = true;
      layers.at("ScaleInfer").backward = "scale_backward";
      d.annotations[std::string(kAnnotationLayers)] = serialize_package_layers(layers);
    }
  });
  Runtime rt;
  add_slots(rt, {"ScaleInfer"});
  Hub h = hub();
  try {
    kernelize(rt, config_, h, local_cpu_device(), {});
    FAIL() << "bound a package its index misdescribes";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kIntegrity) << msg;
    EXPECT_NE(msg.find("test/toy@v1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("kernelhub.layers"), std::string::npos) << msg;
    EXPECT_NE(msg.find("layer ScaleInfer"), std::string::npos) << msg;
  }
  Vec x({1}), y({0});
  EXPECT_EQ(call_scale(rt, "ScaleInfer", x, 2.0, y), kFallbackStatus);  // nothing was bound
}

TEST_F(KernelizeLayout, StrictRefusesAMappedLayerThatFallsBack) {
  Runtime rt;
  add_slots(rt, {"ScaleInfer"});
  Hub h = hub();
  KernelizeOptions o;
  o.strict = true;
  try {
    kernelize(rt, config_, h, local_cpu_device(), o);
    FAIL() << "strict kernelize accepted a train fallback";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused);
    EXPECT_NE(std::string(e.what()).find("ScaleInfer"), std::string::npos) << e.what();
  }
  o.modes = {Mode::kEval};
  EXPECT_NO_THROW(kernelize(rt, config_, h, local_cpu_device(), o));
}

TEST_F(KernelizeLayout, DisableKeepsEveryFallback) {
  Runtime rt;
  add_slots(rt, {"Scale"});
  Hub h = hub();
  KernelizeOptions o;
  o.disable = true;
  KernelizeReport r = kernelize(rt, config_, h, local_cpu_device(), o);
  EXPECT_EQ(r.find("Scale", Mode::kEval)->source, BindingSource::kFallback);
  Vec x({1}), y({0});
  EXPECT_EQ(call_scale(rt, "Scale", x, 2.0, y), kFallbackStatus);
  EXPECT_TRUE(store_.list_refs().empty());  // the hub was never asked

  // The environment variable does the same.
  setenv("KERNEL_HUB_DISABLE", "1", 1);
  Runtime rt2;
  add_slots(rt2, {"Scale"});
  KernelizeReport r2 = kernelize(rt2, config_, h, local_cpu_device(), {});
  unsetenv("KERNEL_HUB_DISABLE");
  EXPECT_EQ(r2.find("Scale", Mode::kTrain)->source, BindingSource::kFallback);
}

TEST_F(KernelizeLayout, LocalOverrideServesAPackageDirectory) {
  Runtime rt;
  add_slots(rt, {"Scale"});
  HubOptions offline;
  offline.offline = true;  // the hub is never asked for a local repo
  Hub h = hub(offline);
  setenv("KERNEL_HUB_LOCAL", ("test/toy=" + toy_package("toy-2.0.0").string()).c_str(), 1);
  KernelizeReport r = kernelize(rt, config_, h, local_cpu_device(), {});
  unsetenv("KERNEL_HUB_LOCAL");
  const KernelizeBinding* b = r.find("Scale", Mode::kEval);
  EXPECT_EQ(b->source, BindingSource::kLocal) << r.str();
  EXPECT_EQ(b->package, "toy@2.0.0");
  Vec x({1, 2}), y({0, 0});
  ASSERT_EQ(call_scale(rt, "Scale", x, 2.0, y), KH_OK);
  EXPECT_EQ(y.data, (std::vector<float>{3, 5}));  // 2.0.0 adds 1

  // A local package with a "files" map is verified: a packed and unpacked copy passes, a
  // tampered one is refused before loading.
  TempDir tmp;
  PackReport p = pack_toy("toy-1.0.0", tmp / "l");
  Store s2(tmp / "c");
  s2.put_blob(p.variants[0].layer,
              fs::read_file(tmp / "l" / "blobs" / "sha256" / p.variants[0].layer.digest.hex));
  auto unpacked = s2.unpack(p.variants[0].layer.digest);
  auto copy = tmp / "pkg";
  std::filesystem::copy(unpacked, copy);
  std::filesystem::permissions(copy, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add);
  KernelizeOptions o;
  o.local = std::map<std::string, std::filesystem::path>{{"test/toy", copy}};
  Runtime rt2;
  add_slots(rt2, {"Scale"});
  EXPECT_EQ(kernelize(rt2, config_, h, local_cpu_device(), o).find("Scale", Mode::kEval)->source,
            BindingSource::kLocal);
  fs::write_file_atomic(copy / "extra.txt", "not in kernel.json");
  Runtime rt3;
  add_slots(rt3, {"Scale"});
  try {
    kernelize(rt3, config_, h, local_cpu_device(), o);
    FAIL() << "a package with an unlisted file was loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIntegrity);
    EXPECT_NE(std::string(e.what()).find("extra.txt"), std::string::npos) << e.what();
  }
}

TEST_F(KernelizeLayout, RefTtlServesTagsFromTheRecordUntilItExpires) {
  Runtime rt;
  add_slots(rt, {"Scale"});
  HubOptions o;
  o.ref_ttl_s = 600;
  {
    Hub h = hub(o);
    kernelize(rt, config_, h, local_cpu_device(), {});
  }
  auto first =
      store_.read_ref(HubAddress::parse(hub_dir_.path().string(), false).id(), "test/toy", "v1");
  ASSERT_TRUE(first.has_value());
  // Move v1 to 2.0.0 on the hub: within the TTL the record still answers.
  PackOptions p;
  p.package_dir = toy_package("toy-2.0.0");
  p.output = hub_dir_.path();
  p.repo = "test/toy";
  p.devices = {"cpu"};
  p.tags = {"v1"};
  sign_as_test_publisher(p);
  PackReport two = pack_package(p);
  Vec x({1}), y({0});
  {
    Runtime r2;
    add_slots(r2, {"Scale"});
    Hub h = hub(o);
    kernelize(r2, config_, h, local_cpu_device(), {});
    ASSERT_EQ(call_scale(r2, "Scale", x, 2.0, y), KH_OK);
    EXPECT_EQ(y.data[0], 2.0f);  // still 1.0.0
  }
  // An expired record (TTL 0: always ask) is re-resolved and the new index is recorded.
  {
    Runtime r3;
    add_slots(r3, {"Scale"});
    Hub h = hub();
    kernelize(r3, config_, h, local_cpu_device(), {});
    ASSERT_EQ(call_scale(r3, "Scale", x, 2.0, y), KH_OK);
    EXPECT_EQ(y.data[0], 3.0f);  // 2.0.0
  }
  auto now =
      store_.read_ref(HubAddress::parse(hub_dir_.path().string(), false).id(), "test/toy", "v1");
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->digest, two.index.digest);
}

}  // namespace
}  // namespace kh::test

// The C API's kh_runtime_kernelize, through libkernel_hub.so as a C program would use it.
#include <dlfcn.h>

#include "kernel_hub/kernel_hub.h"

namespace kh::test {
namespace {

TEST_F(KernelizeLayout, CApiKernelize) {
  void* lib = dlopen(KH_LIBKERNEL_HUB, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto create = reinterpret_cast<decltype(&kh_runtime_create)>(dlsym(lib, "kh_runtime_create"));
  auto destroy = reinterpret_cast<decltype(&kh_runtime_destroy)>(dlsym(lib, "kh_runtime_destroy"));
  auto add_slot =
      reinterpret_cast<decltype(&kh_runtime_add_slot)>(dlsym(lib, "kh_runtime_add_slot"));
  auto kz = reinterpret_cast<decltype(&kh_runtime_kernelize)>(dlsym(lib, "kh_runtime_kernelize"));
  auto free_report =
      reinterpret_cast<decltype(&kh_runtime_free_report)>(dlsym(lib, "kh_runtime_free_report"));
  auto forward = reinterpret_cast<decltype(&kh_runtime_forward)>(dlsym(lib, "kh_runtime_forward"));
  auto last_error = reinterpret_cast<decltype(&kh_last_error)>(dlsym(lib, "kh_last_error"));
  ASSERT_TRUE(create && destroy && add_slot && kz && free_report && forward && last_error);

  setenv("KERNEL_HUB_CACHE", cache_.path().c_str(), 1);
  kh_runtime_t* rt = create(0);
  uint32_t slot = 0;
  ASSERT_EQ(add_slot(rt, "ScaleInfer", toy_fallback, toy_fallback, nullptr, 0, &slot), KH_OK);
  std::string config = toy_config("test/toy");
  char* report = nullptr;
  int32_t status = kz(rt, config.c_str(), hub_dir_.path().c_str(), "cpu", KH_KERNELIZE_EVAL, 0,
                      nullptr, &report);
  ASSERT_EQ(status, KH_OK) << last_error();
  ASSERT_NE(report, nullptr);
  auto j = nlohmann::json::parse(report);
  free_report(report);
  EXPECT_EQ(j["bindings"][0]["source"], "hub") << j.dump();
  Vec x({1, 2}), y({0, 0});
  kh_arg_t a[3];
  a[0].kind = KH_ARG_TENSOR;
  a[0].v.t = &x.t;
  a[1].kind = KH_ARG_FLOAT;
  a[1].v.f = 5;
  a[2].kind = KH_ARG_TENSOR;
  a[2].v.t = &y.t;
  ASSERT_EQ(forward(rt, slot, KH_DEVICE_CPU, a, 3, nullptr), KH_OK) << last_error();
  EXPECT_EQ(y.data, (std::vector<float>{5, 10}));
  EXPECT_EQ(kz(rt, "{not json", nullptr, "cpu", 0, 0, nullptr, nullptr), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(last_error()).find("config_json"), std::string::npos) << last_error();
  EXPECT_EQ(kz(rt, config.c_str(), hub_dir_.path().c_str(), "gpu", 0, 0, nullptr, nullptr),
            KH_ERR_INVALID_ARGUMENT);
  destroy(rt);
  unsetenv("KERNEL_HUB_CACHE");
}

}  // namespace
}  // namespace kh::test
