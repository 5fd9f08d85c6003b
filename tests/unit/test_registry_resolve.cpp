// Resolution: variant checks and preference, capability ranges, the mode chain, traces, lock
// files under resolution, and the hub-backed provider on a real layout hub.
#include <gtest/gtest.h>

#include <filesystem>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/hub.h"
#include "hub/store/archive.h"
#include "registry/hub_index_provider.h"
#include "registry/resolver.h"
#include "registry/versions.h"
#include "tests/fixtures/process.h"

namespace kh {
namespace {

namespace stdfs = std::filesystem;

struct V {
  std::string device = "cuda";
  std::string cuda = "13.0";
  std::string sm = "90";
  bool source = false;
  std::string abi = "1.0";
  std::string os = "linux";
  std::string arch = "amd64";
  bool platform = true;
  std::string media_type{oci::kMediaTypeManifest};
};

oci::Descriptor make_variant(const V& v, const std::string& salt) {
  oci::Descriptor d;
  d.media_type = v.media_type;
  d.digest = sha256_of("manifest " + salt);
  d.size = 100;
  if (v.platform) d.platform = oci::Platform{v.os, v.arch, ""};
  if (!v.device.empty()) d.annotations[std::string(kAnnotationDevice)] = v.device;
  if (!v.abi.empty()) d.annotations[std::string(kAnnotationAbi)] = v.abi;
  if (v.device == "cuda") {
    if (!v.cuda.empty()) d.annotations[std::string(kAnnotationCudaVersion)] = v.cuda;
    if (!v.sm.empty()) d.annotations[std::string(kAnnotationCudaSm)] = v.sm;
    if (v.source) d.annotations[std::string(kAnnotationSource)] = "true";
  }
  return d;
}

oci::Index make_index(const std::vector<V>& vs, const std::string& salt = "") {
  oci::Index i;
  i.artifact_type = std::string(oci::kArtifactTypeKernel);
  for (size_t n = 0; n < vs.size(); ++n)
    i.manifests.push_back(make_variant(vs[n], salt + std::to_string(n)));
  return i;
}

Device cuda(int sm, const std::string& version = "13.0") {
  return make_device({"cuda", std::to_string(sm), version, "linux", "amd64"});
}
Device cpu() {
  return make_device({"cpu", {}, {}, "linux", "amd64"});
}

PackageManifest package(const std::string& name, const std::string& layer, bool backward) {
  PackageManifest p;
  p.name = name;
  p.version = "1.0.0";
  p.abi_major = 1;
  p.device = "cpu";
  p.host_library = "lib.so";
  PackageLayer l;
  l.forward = "fwd";
  if (backward) {
    l.backward = "bwd";
    l.has_backward = true;
  }
  l.dtypes = {"fp32"};
  p.layers[layer] = l;
  return p;
}

// An in-memory hub for the table-driven tests: the resolver is pure, so it is fed indexes,
// manifests and kernel.json directly. (The hub-backed provider is tested on a real hub below.)
class TableProvider : public IndexProvider {
 public:
  std::map<std::string, IndexRecord> indexes;
  std::map<Digest, oci::Manifest> manifests;
  std::map<Digest, PackageManifest> packages;
  bool know_packages = true;
  int index_calls = 0;

  // Adds repo with the variants; every variant gets a manifest with one tar+zstd layer and,
  // when pkg is set, that kernel.json.
  void add(const std::string& ref, const std::vector<V>& vs,
           std::optional<PackageManifest> pkg = std::nullopt) {
    IndexRecord rec;
    rec.ref = Ref::parse(ref);
    rec.index = make_index(vs, ref);
    rec.digest = sha256_of(oci::serialize(rec.index));
    rec.hub_id = "table/hub";
    for (auto& d : rec.index.manifests) {
      oci::Manifest m;
      m.artifact_type = std::string(oci::kArtifactTypeKernel);
      m.config = oci::empty_descriptor();
      std::string layer = "layer of " + d.digest.str();
      m.layers.push_back(oci::describe(layer, oci::kMediaTypeLayerTarZstd));
      manifests[d.digest] = m;
      if (pkg) packages[d.digest] = *pkg;
    }
    indexes[rec.ref.str()] = rec;
  }

  IndexRecord index(const Ref& ref) override {
    ++index_calls;
    auto it = indexes.find(ref.str());
    if (it == indexes.end())
      throw Error(ErrorKind::kNotFound, ref.str() + ": no such ref on the table hub");
    return it->second;
  }
  std::optional<oci::Manifest> manifest(const Ref&, const oci::Descriptor& v) override {
    auto it = manifests.find(v.digest);
    if (it == manifests.end()) return std::nullopt;
    return it->second;
  }
  std::optional<PackageManifest> package(const Ref&, const oci::Descriptor& v) override {
    if (!know_packages) return std::nullopt;
    auto it = packages.find(v.digest);
    if (it == packages.end()) return std::nullopt;
    return it->second;
  }
};

bool trace_has(const std::vector<TraceStep>& trace, const std::string& text) {
  for (auto& s : trace)
    if (s.reason.find(text) != std::string::npos || s.candidate.find(text) != std::string::npos)
      return true;
  return false;
}

std::string dump(const std::vector<TraceStep>& trace) {
  LayerResolution r;
  r.trace = trace;
  return format_trace(r);
}

// --- variants ---

TEST(SelectVariant, EveryRejectionReason) {
  ResolveOptions host;
  host.abi_major = 1;
  host.abi_minor = 2;
  struct Case {
    const char* name;
    V v;
    Device device;
    const char* reason;
  } cases[] = {
      {"nested index",
       {.media_type = std::string(oci::kMediaTypeIndex)},
       cuda(90),
       "is not a variant manifest"},
      {"no platform", {.platform = false}, cuda(90), "no platform (os/architecture)"},
      {"os", {.os = "windows"}, cuda(90), "os windows != device os linux"},
      {"arch", {.arch = "arm64"}, cuda(90), "architecture arm64 != device architecture amd64"},
      {"no abi", {.abi = ""}, cuda(90), "no kernelhub.abi annotation"},
      {"bad abi", {.abi = "one"}, cuda(90), "kernelhub.abi 'one' is not MAJOR.MINOR"},
      {"abi major", {.abi = "2.0"}, cuda(90), "major 2 != host ABI major 1"},
      {"abi minor", {.abi = "1.99"}, cuda(90), "needs minor 99 > host ABI 1."},
      {"no device", {.device = ""}, cuda(90), "no kernelhub.device annotation"},
      {"device", {.device = "cpu"}, cuda(90), "device cpu != cuda"},
      {"device cuda on cpu", {}, cpu(), "device cuda != cpu"},
      {"no cuda version", {.cuda = ""}, cuda(90), "no kernelhub.cuda.version annotation"},
      {"bad cuda version", {.cuda = "13.x"}, cuda(90), "kernelhub.cuda.version '13.x'"},
      {"cuda major", {.cuda = "12.4"}, cuda(90), "needs CUDA 12.4: major 12 != driver CUDA 13.0"},
      {"cuda minor", {.cuda = "13.2"}, cuda(90), "needs CUDA 13.2 > driver CUDA 13.0"},
      {"bad sm list", {.sm = "90,nine"}, cuda(90), "kernelhub.cuda.sm '90,nine' is not a list"},
      {"no cubin, no source",
       {.sm = "80,100"},
       cuda(90),
       "no cubin for sm_90 (has: 80,100) and no source for NVRTC"},
      {"higher minor cubin", {.sm = "89"}, cuda(86), "no cubin for sm_86 (has: 89)"},
      {"arch-specific on other sm", {.sm = "100a"}, cuda(103), "'a' cubins run on their sm only"},
      {"no sm list, no source", {.sm = ""}, cuda(90), "no cubin for sm_90 (has: none)"},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    VariantSelection sel = select_variant(make_index({c.v}), c.device, host);
    EXPECT_FALSE(sel.chosen);
    ASSERT_EQ(sel.trace.size(), 1u);
    EXPECT_FALSE(sel.trace[0].accepted);
    EXPECT_NE(sel.trace[0].reason.find(c.reason), std::string::npos) << sel.trace[0].reason;
  }
  VariantSelection none = select_variant(oci::Index{}, cuda(90), host);
  EXPECT_FALSE(none.chosen);
  EXPECT_TRUE(trace_has(none.trace, "lists no manifests"));
}

TEST(SelectVariant, Accepts) {
  ResolveOptions host;
  struct Case {
    const char* name;
    V v;
    Device device;
    VariantCode code;
    const char* cubin;
  } cases[] = {
      {"exact", {.sm = "80,90"}, cuda(90), VariantCode::kCubinExact, "90"},
      {"exact 90a on 90", {.sm = "90a"}, cuda(90), VariantCode::kCubinExact, "90a"},
      {"lower minor", {.sm = "80"}, cuda(86), VariantCode::kCubinCompatible, "80"},
      {"lower driver minor ok",
       {.cuda = "12.4", .sm = "90"},
       cuda(90, "12.8"),
       VariantCode::kCubinExact,
       "90"},
      {"source", {.sm = "80", .source = true}, cuda(90), VariantCode::kNvrtcSource, ""},
      {"source, no cubins", {.sm = "", .source = true}, cuda(120), VariantCode::kNvrtcSource, ""},
      {"cpu", {.device = "cpu"}, cpu(), VariantCode::kHost, ""},
      {"sm_ prefix and spaces", {.sm = "sm_80, sm_90"}, cuda(90), VariantCode::kCubinExact, "90"},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    VariantSelection sel = select_variant(make_index({c.v}), c.device, host);
    ASSERT_TRUE(sel.chosen) << dump(sel.trace);
    EXPECT_EQ(sel.chosen->code, c.code);
    EXPECT_EQ(sel.chosen->cubin_sm, c.cubin);
    EXPECT_TRUE(sel.trace[0].accepted);
    EXPECT_EQ(sel.trace[0].reason.rfind("chosen: ", 0), 0u) << sel.trace[0].reason;
  }
}

// The documented preference order among variants that fit.
TEST(SelectVariant, PreferenceOrder) {
  ResolveOptions host;
  host.abi_minor = 2;
  struct Case {
    const char* name;
    std::vector<V> vs;
    Device device;
    size_t chosen;
    const char* loser_reason;  // in the trace of the other fitting variants
  } cases[] = {
      {"exact beats lower-minor beats source",
       {{.sm = "", .source = true}, {.sm = "80"}, {.sm = "86"}},
       cuda(86),
       2,
       "exact cubin beats"},
      {"lower-minor beats source",
       {{.sm = "", .source = true}, {.sm = "80"}},
       cuda(86),
       1,
       "lower-minor cubin beats NVRTC from source"},
      {"closest lower minor",
       {{.sm = "80"}, {.sm = "86"}},
       cuda(89),
       1,
       "cubin sm_86 is closer than sm_80"},
      {"exact beats newer CUDA",
       {{.cuda = "13.0", .sm = "80"}, {.cuda = "12.0", .sm = "86"}},
       cuda(86, "13.0"),
       0,
       nullptr},
      {"newer CUDA",
       {{.cuda = "12.4"}, {.cuda = "12.8"}, {.cuda = "12.6"}},
       cuda(90, "12.8"),
       1,
       "newer CUDA 12.8 beats 12.4"},
      {"higher ABI minor",
       {{.abi = "1.0"}, {.abi = "1.2"}, {.abi = "1.1"}},
       cuda(90),
       1,
       "higher ABI minor 2 beats 0"},
      {"earlier in the index", {{.sm = "90"}, {.sm = "90"}}, cuda(90), 0, "earlier in the index"},
      {"cpu: earlier", {{.device = "cpu"}, {.device = "cpu"}}, cpu(), 0, "earlier in the index"},
      {"skips misfits", {{.arch = "arm64"}, {.cuda = "13.1"}, {.sm = "90"}}, cuda(90), 2, nullptr},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    VariantSelection sel = select_variant(make_index(c.vs), c.device, host);
    ASSERT_TRUE(sel.chosen) << dump(sel.trace);
    EXPECT_EQ(sel.chosen->position, c.chosen) << dump(sel.trace);
    ASSERT_EQ(sel.trace.size(), c.vs.size());
    for (size_t i = 0; i < sel.trace.size(); ++i) EXPECT_EQ(sel.trace[i].accepted, i == c.chosen);
    if (c.loser_reason) {
      EXPECT_TRUE(trace_has(sel.trace, c.loser_reason)) << dump(sel.trace);
    }
  }
  // Exact beats lower-minor even with an older CUDA: the loser says why.
  VariantSelection sel =
      select_variant(make_index({{.cuda = "13.0", .sm = "80"}, {.cuda = "12.0", .sm = "86"}}),
                     cuda(86, "12.9"), host);
  ASSERT_TRUE(sel.chosen);
  EXPECT_EQ(sel.chosen->position, 1u);
}

TEST(SelectVariant, OnlyTheLockedVariant) {
  oci::Index index = make_index({{.sm = "90"}, {.sm = "90"}});
  VariantSelection sel = select_variant(index, cuda(90), {}, index.manifests[1].digest);
  ASSERT_TRUE(sel.chosen);
  EXPECT_EQ(sel.chosen->position, 1u);
  EXPECT_TRUE(trace_has(sel.trace, "not the locked variant"));
}

// --- capability ranges ---

TEST(Resolve, CapabilityRanges) {
  TableProvider hub;
  for (const char* r : {"org/a", "org/b", "org/c"}) hub.add(r, {{.sm = "80,86,89,90"}});
  struct Case {
    const char* name;
    const char* cuda_json;  // the "cuda" value
    int sm;
    const char* served;  // repo, or nullptr for the runtime fallback
    const char* trace;
  } cases[] = {
      {"narrowest wins",
       R"([{"capability": {"min": 80, "max": 89}, "modes": {"eval": "org/a"}},
           {"capability": {"min": 86, "max": 86}, "modes": {"eval": "org/b"}},
           {"modes": {"eval": "org/c"}}])",
       86, "org/b", "narrowest range containing sm 86"},
      {"range beats none",
       R"([{"modes": {"eval": "org/c"}}, {"capability": {"min": 80, "max": 89}, "modes": {"eval": "org/a"}}])",
       86, "org/a", "[80, 89] at $.L.cuda[1] is narrower"},
      {"none covers all", R"([{"modes": {"eval": "org/c"}}])", 90, "org/c", "the only entry"},
      {"equal width: last wins",
       R"([{"capability": {"min": 80, "max": 89}, "modes": {"eval": "org/a"}},
           {"capability": {"min": 85, "max": 94}, "modes": {"eval": "org/b"}}])",
       86, "org/b", "registered later: the last registered wins"},
      {"equal width, reversed",
       R"([{"capability": {"min": 85, "max": 94}, "modes": {"eval": "org/b"}},
           {"capability": {"min": 80, "max": 89}, "modes": {"eval": "org/a"}}])",
       86, "org/a", "registered later: the last registered wins"},
      {"open max", R"([{"capability": {"min": 80}, "modes": {"eval": "org/a"}},
                       {"capability": {"min": 80, "max": 89}, "modes": {"eval": "org/b"}}])",
       89, "org/b", "[80, any] at $.L.cuda[0]"},
      {"outside every range",
       R"([{"capability": {"min": 80, "max": 89}, "modes": {"eval": "org/a"}}])", 90, nullptr,
       "does not contain sm 90"},
      {"narrowest without a kernel: no wider retry (HF)",
       R"([{"capability": {"min": 90, "max": 90}, "modes": {"eval": "org/none"}},
           {"modes": {"eval": "org/c"}}])",
       90, nullptr, "index unavailable"},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    KernelConfig config =
        KernelConfig::parse(std::string(R"({"L": {"cuda": )") + c.cuda_json + "}}");
    LayerResolution r = resolve_layer(config, "L", cuda(c.sm), Mode::kEval, hub);
    std::string t = format_trace(r);
    if (c.served) {
      ASSERT_FALSE(r.fallback) << t;
      EXPECT_EQ(r.kernel.ref.repo, c.served) << t;
    } else {
      EXPECT_TRUE(r.fallback) << t;
    }
    EXPECT_NE(t.find(c.trace), std::string::npos) << t;
  }
}

// --- mode chain ---

TEST(Resolve, ModeChain) {
  TableProvider hub;
  hub.add("org/evalk", {{.device = "cpu"}}, package("org/evalk", "L", false));
  hub.add("org/traink", {{.device = "cpu"}}, package("org/traink", "L", true));
  hub.add("org/fallk", {{.device = "cpu"}}, package("org/fallk", "L", true));
  hub.add("org/fallnb", {{.device = "cpu"}}, package("org/fallnb", "L", false));
  hub.add("org/otherlayer", {{.device = "cpu"}}, package("org/otherlayer", "Other", true));
  hub.add("org/cudaonly", {{.device = "cuda"}}, package("org/cudaonly", "L", true));
  struct Case {
    const char* name;
    const char* modes;  // the cpu mode map
    Mode requested;
    const char* served;  // repo, or nullptr for the runtime fallback
    ModeKey entry;
    const char* trace;
  } cases[] = {
      {"eval: eval entry",
       R"({"eval": "org/evalk", "train": "org/traink", "fallback": "org/fallk"})", Mode::kEval,
       "org/evalk", Mode::kEval, "serves"},
      {"train: train entry",
       R"({"eval": "org/evalk", "train": "org/traink", "fallback": "org/fallk"})", Mode::kTrain,
       "org/traink", Mode::kTrain, "with a backward op"},
      {"eval: train kernel serves eval", R"({"train": "org/traink"})", Mode::kEval, "org/traink",
       Mode::kTrain, "no eval entry"},
      {"eval: fallback entry", R"({"fallback": "org/fallk"})", Mode::kEval, "org/fallk",
       ModeKey::fallback(), "no train entry"},
      {"train: fallback entry", R"({"eval": "org/evalk", "fallback": "org/fallk"})", Mode::kTrain,
       "org/fallk", ModeKey::fallback(), "no train entry"},
      {"train: eval kernel never serves train", R"({"eval": "org/traink"})", Mode::kTrain, nullptr,
       Mode::kEval, "an eval kernel never serves train"},
      {"train: train entry without backward", R"({"train": "org/evalk", "fallback": "org/fallk"})",
       Mode::kTrain, "org/fallk", ModeKey::fallback(),
       "layer L has no backward op; train needs one"},
      {"train: fallback without backward", R"({"fallback": "org/fallnb"})", Mode::kTrain, nullptr,
       Mode::kEval, "no backward op"},
      {"eval: fallback without backward serves eval", R"({"fallback": "org/fallnb"})", Mode::kEval,
       "org/fallnb", ModeKey::fallback(), "serves eval"},
      {"eval: unavailable index, next entry", R"({"eval": "org/missing", "train": "org/traink"})",
       Mode::kEval, "org/traink", Mode::kTrain, "no such ref on the table hub"},
      {"eval: no variant for the device, next entry",
       R"({"eval": "org/cudaonly", "fallback": "org/fallk"})", Mode::kEval, "org/fallk",
       ModeKey::fallback(), "no variant fits cpu linux/amd64"},
      {"package lacks the layer", R"({"eval": "org/otherlayer"})", Mode::kEval, nullptr,
       Mode::kEval, "has no layer L (has: Other)"},
      {"nothing serves", R"({"eval": "org/missing"})", Mode::kEval, nullptr, Mode::kEval,
       "the runtime's own implementation"},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    KernelConfig config = KernelConfig::parse(std::string(R"({"L": {"cpu": )") + c.modes + "}}");
    LayerResolution r = resolve_layer(config, "L", cpu(), c.requested, hub);
    std::string t = format_trace(r);
    if (c.served) {
      ASSERT_FALSE(r.fallback) << t;
      EXPECT_EQ(r.kernel.ref.repo, c.served) << t;
      EXPECT_EQ(r.entry_mode, c.entry) << t;
      ASSERT_TRUE(r.variant);
      ASSERT_TRUE(r.package_layer);
      EXPECT_EQ(r.package_layer->media_type, oci::kMediaTypeLayerTarZstd);
    } else {
      EXPECT_TRUE(r.fallback) << t;
    }
    EXPECT_NE(t.find(c.trace), std::string::npos) << t;
  }
}

TEST(Resolve, UnknownPackageIsCheckedAtBind) {
  TableProvider hub;
  hub.add("org/evalk", {{.device = "cpu"}}, package("org/evalk", "L", false));
  hub.know_packages = false;
  KernelConfig config = KernelConfig::parse(R"({"L": {"cpu": {"train": "org/evalk"}}})");
  LayerResolution r = resolve_layer(config, "L", cpu(), Mode::kTrain, hub);
  EXPECT_FALSE(r.fallback);
  EXPECT_TRUE(trace_has(r.trace, "the loader checks the layer's ops at bind"));
}

// Gives ref's index entries the kernelhub.layers annotation `text`, and the index the title and
// version pack writes.
void annotate_layers(TableProvider& hub, const std::string& ref, const std::string& text) {
  IndexRecord& rec = hub.indexes.at(Ref::parse(ref).str());
  rec.index.annotations[std::string(oci::kAnnotationTitle)] = ref;
  rec.index.annotations[std::string(oci::kAnnotationVersion)] = "1.0.0";
  for (auto& d : rec.index.manifests) d.annotations[std::string(kAnnotationLayers)] = text;
}

TEST(Resolve, TheIndexAnnotationTellsTheLayersBeforeAFetch) {
  TableProvider hub;
  hub.add("org/evalk", {{.device = "cpu"}}, package("org/evalk", "L", false));
  hub.add("org/fallk", {{.device = "cpu"}}, package("org/fallk", "L", true));
  annotate_layers(hub, "org/evalk",
                  serialize_package_layers(package("org/evalk", "L", false).layers));
  annotate_layers(hub, "org/fallk",
                  serialize_package_layers(package("org/fallk", "L", true).layers));
  hub.know_packages = false;  // nothing fetched yet
  KernelConfig config =
      KernelConfig::parse(R"({"L": {"cpu": {"train": "org/evalk", "fallback": "org/fallk"}}})");
  LayerResolution r = resolve_layer(config, "L", cpu(), Mode::kTrain, hub);
  std::string t = format_trace(r);
  ASSERT_FALSE(r.fallback) << t;
  EXPECT_EQ(r.kernel.ref.repo, "org/fallk") << t;  // the train entry has no backward op
  EXPECT_EQ(r.layers_from, LayersSource::kIndexAnnotation);
  EXPECT_TRUE(trace_has(r.trace, "layer L has no backward op; train needs one")) << t;
  EXPECT_TRUE(trace_has(r.trace, "layer L present with a backward op")) << t;
  EXPECT_FALSE(trace_has(r.trace, "not fetched yet")) << t;

  // kernel.json, when at hand, is what decides; the trace reads the same.
  hub.know_packages = true;
  LayerResolution known = resolve_layer(config, "L", cpu(), Mode::kTrain, hub);
  EXPECT_EQ(known.layers_from, LayersSource::kPackage);
  EXPECT_EQ(format_trace(known), t);
}

TEST(Resolve, ALayersAnnotationThatDoesNotParseIsIgnored) {
  const std::string valid = serialize_package_layers(package("org/k", "L", true).layers);
  for (const std::string& text :
       {std::string("not json"), std::string("{}"), std::string(R"({"L": {"ops": {}}})"),
        std::string(
            R"({"L": {"ops": {"forward": "f"}, "flags": ["backward"], "dtypes": ["fp32"]}})"),
        valid + std::string(kMaxLayersAnnotationBytes, ' ')}) {
    SCOPED_TRACE(text.substr(0, 80));
    TableProvider hub;
    hub.add("org/k", {{.device = "cpu"}}, package("org/k", "L", true));
    annotate_layers(hub, "org/k", text);
    hub.know_packages = false;
    KernelConfig config = KernelConfig::parse(R"({"L": {"cpu": {"train": "org/k"}}})");
    LayerResolution r = resolve_layer(config, "L", cpu(), Mode::kTrain, hub);
    ASSERT_FALSE(r.fallback) << format_trace(r);
    EXPECT_EQ(r.layers_from, LayersSource::kUnknown);
    EXPECT_TRUE(trace_has(r.trace, "annotation ignored")) << format_trace(r);
    EXPECT_TRUE(trace_has(r.trace, "the loader checks the layer's ops at bind"));
  }
}

TEST(Resolve, LayersDevicesAndTraceText) {
  TableProvider hub;
  hub.add("org/n", {{.device = "cpu"}, {.sm = "90"}});
  KernelConfig config = KernelConfig::parse(R"({
    "A": "org/n", "B": {"cpu": "org/n"}, "C": {"cuda": "org/n:Fused"}})");
  Resolution res = resolve(config, cuda(90), Mode::kEval, hub);
  EXPECT_EQ(hub.index_calls, 1);  // one ref, asked once for three layers
  ASSERT_EQ(res.layers.size(), 3u);
  EXPECT_FALSE(res.find("A")->fallback);
  EXPECT_EQ(res.find("A")->variant->position, 1u);
  EXPECT_TRUE(res.find("B")->fallback);
  EXPECT_TRUE(trace_has(res.find("B")->trace, "no cuda entry (config has: cpu)"));
  EXPECT_EQ(res.find("C")->summary(), "C eval: org/n@v1:Fused, variant 1 exact cubin sm_90");
  EXPECT_EQ(res.find("Z"), nullptr);
  LayerResolution missing = resolve_layer(config, "Z", cpu(), Mode::kEval, hub);
  EXPECT_TRUE(missing.fallback);
  EXPECT_TRUE(trace_has(missing.trace, "no mapping for this layer"));

  std::string t = format_trace(*res.find("A"));
  EXPECT_NE(t.find("A eval: org/n@v1:A, variant 1 exact cubin sm_90\n"), std::string::npos) << t;
  EXPECT_NE(t.find("[variant] rejected variant 0"), std::string::npos) << t;
  EXPECT_NE(t.find("device cpu != cuda"), std::string::npos) << t;
  EXPECT_NE(t.find("[variant] accepted variant 1"), std::string::npos) << t;
  EXPECT_NE(t.find("[mode] accepted eval: org/n@v1:A at $.A"), std::string::npos) << t;
}

// --- lock files under resolution ---

TEST(Resolve, LockBuildAndCheck) {
  TableProvider hub;
  hub.add("org/n", {{.device = "cpu"}, {.sm = "80"}, {.sm = "90"}});
  hub.add("org/cpuonly", {{.device = "cpu"}});
  KernelConfig config =
      KernelConfig::parse(R"({"A": {"cuda": "org/n", "cpu": "org/n"}, "B": {"cpu": "org/cpuonly"},
                             "C": {"cuda": "org/cpuonly"}})");
  LockBuild built = build_lock(config, {cpu(), cuda(90)}, hub);
  ASSERT_EQ(built.lock.entries.size(), 2u);
  const LockEntry* n = built.lock.find(Ref::parse("org/n"));
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->targets.size(), 2u);
  const IndexRecord idx = hub.indexes.at("org/n@v1");  // a copy: the hub changes below
  EXPECT_EQ(n->index_digest, idx.digest);
  EXPECT_EQ(n->hub, "table/hub");
  EXPECT_EQ(n->targets.at(cuda(90).str()).manifest_digest, idx.index.manifests[2].digest);
  EXPECT_EQ(n->targets.at(cpu().str()).layer_digest,
            hub.manifests.at(idx.index.manifests[0].digest).layers[0].digest);
  // org/cpuonly for cuda (layer C) has no variant: reported, not locked for cuda.
  ASSERT_EQ(built.misses.size(), 1u);
  EXPECT_NE(built.misses[0].find("org/cpuonly@v1 for cuda:sm_90"), std::string::npos);
  EXPECT_EQ(built.lock.find(Ref::parse("org/cpuonly"))->targets.size(), 1u);

  // The lock survives a round trip and resolves to the same digests.
  LockFile lock = LockFile::parse(built.lock.serialize());
  ResolveOptions locked;
  locked.lock = &lock;
  LayerResolution r = resolve_layer(config, "A", cuda(90), Mode::kEval, hub, locked);
  ASSERT_FALSE(r.fallback) << format_trace(r);
  EXPECT_EQ(r.variant->descriptor.digest, idx.index.manifests[2].digest);
  EXPECT_TRUE(trace_has(r.trace, "as locked"));

  auto expect_error = [&](const Device& d, ErrorKind kind, std::vector<std::string> parts) {
    try {
      resolve_layer(config, "A", d, Mode::kEval, hub, locked);
      ADD_FAILURE() << "resolved under a violated lock";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      for (auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  // A device the lock has no target for.
  expect_error(cuda(80), ErrorKind::kNotFound, {"org/n@v1", "no target for device cuda:sm_80"});

  // The hub now serves another index for the tag: the digest error names ref, expected, found.
  TableProvider original = hub;
  hub.add("org/n", {{.device = "cpu"}, {.sm = "90"}, {.sm = "80"}});
  expect_error(cuda(90), ErrorKind::kIntegrity,
               {"org/n@v1", "index digest mismatch", "expected " + idx.digest.str(),
                "found " + hub.indexes.at("org/n@v1").digest.str()});

  // Same index digest but the locked manifest serves another layer.
  hub = original;
  Digest chosen = idx.index.manifests[2].digest;
  Digest old_layer = hub.manifests.at(chosen).layers[0].digest;
  hub.manifests.at(chosen).layers[0] = oci::describe("other bytes", oci::kMediaTypeLayerTarZstd);
  expect_error(cuda(90), ErrorKind::kIntegrity,
               {"org/n@v1", "layer digest mismatch", "expected " + old_layer.str(),
                "found " + hub.manifests.at(chosen).layers[0].digest.str()});

  // A ref the lock does not know.
  hub = original;
  KernelConfig other = KernelConfig::parse(R"({"A": {"cpu": "org/n@v2"}})");
  hub.add("org/n@v2", {{.device = "cpu"}});
  try {
    resolve_layer(other, "A", cpu(), Mode::kEval, hub, locked);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("org/n@v2 is not in the lock file"), std::string::npos);
  }
}

// Every entry that cannot serve says why in LayerResolution::unserved; layers the config does
// not map here (or maps for no mode tried) are not "unserved".
TEST(Resolve, UnservedSaysWhyPerEntry) {
  TableProvider hub;
  hub.add("org/n", {{.device = "cpu"}}, package("n", "A", false));
  KernelConfig config = KernelConfig::parse(R"({
    "Hf": {"cpu": {"eval": "kernels-community/activation:SiluAndMul"}},
    "Tag": {"cpu": {"eval": "org/n@v9:A"}},
    "Main": {"cpu": {"eval": ["org/n:A", {"revision": "main"}]}},
    "Sha": {"cpu": {"eval": "org/n@abcdef0123456789abcdef0123456789abcdef01:A"}},
    "NoLayer": {"cpu": {"eval": "org/n:Missing", "fallback": "org/n@v9:A"}},
    "NoBackward": {"cpu": {"train": "org/n:A"}},
    "NoVariant": {"cuda": "org/n:A"},
    "Served": {"cpu": {"eval": "org/n@v9:A", "fallback": "org/n:A"}},
    "Rocm": {"rocm": "org/n:A"},
    "Both": "org/absent:A"
  })");
  auto unserved = [&](const char* layer, Mode mode, const Device& d) {
    return resolve_layer(config, layer, d, mode, hub).unserved;
  };
  EXPECT_NE(unserved("Hf", Mode::kEval, cpu()).find("is a Hugging Face Hub repository"),
            std::string::npos);
  EXPECT_EQ(unserved("Tag", Mode::kEval, cpu()).rfind("eval: org/n@v9:A: org/n@v9: no such ref", 0),
            0u);
  EXPECT_NE(unserved("Main", Mode::kEval, cpu()).find("revision 'main' is a branch name"),
            std::string::npos);
  EXPECT_NE(unserved("Sha", Mode::kEval, cpu()).find("looks like a git commit"), std::string::npos);
  std::string no_layer = unserved("NoLayer", Mode::kEval, cpu());
  EXPECT_NE(no_layer.find("eval: org/n@v1:Missing: package n 1.0.0 (org/n@v1) has no layer "
                          "Missing (has: A)"),
            std::string::npos)
      << no_layer;
  EXPECT_NE(no_layer.find("; fallback: org/n@v9:A: "), std::string::npos) << no_layer;
  EXPECT_NE(unserved("NoBackward", Mode::kTrain, cpu()).find("has no backward op"),
            std::string::npos);
  EXPECT_NE(unserved("NoVariant", Mode::kEval, cuda(90)).find("no variant of org/n@v1 fits"),
            std::string::npos);
  // Served by a later entry: nothing unserved. No entry for the device or mode: a plain fallback.
  LayerResolution served = resolve_layer(config, "Served", cpu(), Mode::kEval, hub);
  EXPECT_FALSE(served.fallback);
  EXPECT_TRUE(served.unserved.empty()) << served.unserved;
  EXPECT_TRUE(unserved("Rocm", Mode::kEval, cpu()).empty());
  // One ref for both modes failing alike is said once.
  std::string both = unserved("Both", Mode::kEval, cpu());
  EXPECT_EQ(both.rfind("eval, train: org/absent@v1:A: ", 0), 0u) << both;
  EXPECT_EQ(both.find("; "), std::string::npos) << both;
  EXPECT_TRUE(unserved("Tag", Mode::kEval, cuda(90)).empty());
  EXPECT_TRUE(unserved("Absent", Mode::kEval, cpu()).empty());
  EXPECT_NE(format_trace(resolve_layer(config, "Tag", cpu(), Mode::kEval, hub)).find("unserved: "),
            std::string::npos);

  // lock: refs that cannot be had and layers a package lacks are unserved, not misses.
  LockBuild built = build_lock(config, {cpu()}, hub);
  EXPECT_TRUE(built.misses.empty()) << built.misses.front();
  ASSERT_EQ(built.lock.entries.size(), 1u);
  EXPECT_EQ(built.lock.entries[0].ref.str(), "org/n@v1");
  auto listed = [&](const std::string& text) {
    for (auto& u : built.unserved)
      if (u.find(text) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(listed("Hf cpu eval: kernels-community/activation@v1:SiluAndMul: "));
  EXPECT_TRUE(listed("Tag cpu eval: org/n@v9:A: "));
  EXPECT_TRUE(listed("NoLayer cpu eval: org/n@v1:Missing: package n 1.0.0 has no layer Missing"));
  EXPECT_FALSE(listed("Served cpu fallback"));
  EXPECT_NO_THROW(built.require_complete("lock", "x.lock", false));
  EXPECT_THROW(built.require_complete("lock", "x.lock", true), Error);
}

// A tag that names one variant manifest: the manifest's own annotations describe it.
TEST(Resolve, ASingleVariantManifestDescribesItself) {
  oci::Manifest m;
  m.annotations = {{std::string(kAnnotationDevice), "cuda"},
                   {std::string(kAnnotationAbi), "1.0"},
                   {std::string(kAnnotationCudaVersion), "12.4"},
                   {std::string(kAnnotationCudaSm), "80,90"},
                   {std::string(kAnnotationPlatform), "linux/amd64"}};
  oci::Descriptor bare;
  bare.media_type = std::string(oci::kMediaTypeManifest);
  bare.digest = sha256_of("single");
  bare.size = 10;
  oci::Index index;
  index.manifests.push_back(describe_single_variant(bare, m));
  ASSERT_TRUE(index.manifests[0].platform);
  EXPECT_EQ(index.manifests[0].platform->architecture, "amd64");
  VariantSelection fits = select_variant(index, cuda(90, "12.6"), {});
  ASSERT_TRUE(fits.chosen);
  EXPECT_EQ(fits.chosen->cubin_sm, "90");
  VariantSelection old_driver = select_variant(index, cuda(90, "12.2"), {});
  EXPECT_FALSE(old_driver.chosen);
  EXPECT_TRUE(trace_has(old_driver.trace, "needs CUDA 12.4 > driver CUDA 12.2"));
  EXPECT_FALSE(select_variant(index, cpu(), {}).chosen);
  // Without the platform annotation (an older pack copied alone), the reason says what to do.
  oci::Index old;
  old.manifests.push_back(describe_single_variant(bare, oci::Manifest{}));
  VariantSelection none = select_variant(old, cpu(), {});
  EXPECT_FALSE(none.chosen);
  EXPECT_TRUE(trace_has(none.trace, "skopeo copy --all"));
}

TEST(Versions, SortedSemverAwareSignatureTagsLeftOut) {
  VersionList l = VersionList::from_tags({"1.10.0", "v10", "latest", "1.2.0", "v2",
                                          "sha256-" + std::string(64, 'a'), "2.0.0", "2.0.0-rc1",
                                          "v1", "1.2.0+build", "main", "vx"});
  EXPECT_EQ(l.channels, (std::vector<std::string>{"v1", "v2", "v10"}));
  EXPECT_EQ(l.versions,
            (std::vector<std::string>{"1.2.0", "1.2.0+build", "1.10.0", "2.0.0-rc1", "2.0.0"}));
  EXPECT_EQ(l.other, (std::vector<std::string>{"latest", "main", "vx"}));
  EXPECT_EQ(format_versions(l, 4), "v1, v2, v10, 1.2.0 ... and 7 more");
  EXPECT_EQ(format_versions(VersionList{}), "none");
}

// --- the hub-backed provider on a real layout hub ---

// Publishes a cpu package (host library + kernel.json listing it) as an OCI layout at
// root/<repo> tagged `tag`, with the annotations the resolver reads.
Digest publish(const stdfs::path& root, const std::string& repo, const std::string& tag,
               const std::string& payload, bool backward) {
  test::TempDir work;
  stdfs::path pkg = work.path() / "pkg";
  fs::write_file_atomic(pkg / "libscale.so", payload);
  PackageManifest m = package(repo, "Scale", backward);
  m.host_library = "libscale.so";
  m.files = hash_package_files(pkg);
  fs::write_file_atomic(pkg / "kernel.json", m.serialize());
  stdfs::path archive = work.path() / "layer.tar.zst";
  create_archive(pkg, archive);

  stdfs::path layout = root / repo;
  auto put = [&](std::string_view bytes) {
    fs::write_file_atomic(layout / "blobs/sha256" / sha256_of(bytes).hex, bytes);
  };
  fs::write_file_atomic(layout / "oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
  std::string layer = fs::read_file(archive);
  put(layer);
  put("{}");
  oci::Manifest man;
  man.artifact_type = std::string(oci::kArtifactTypeKernel);
  man.config = oci::empty_descriptor();
  man.layers.push_back(oci::describe(layer, oci::kMediaTypeLayerTarZstd));
  std::string mbytes = oci::serialize(man);
  put(mbytes);
  oci::Index index;
  index.artifact_type = std::string(oci::kArtifactTypeKernel);
  oci::Descriptor md = oci::describe(mbytes, oci::kMediaTypeManifest);
  md.platform = oci::Platform{local_os(), local_arch(), ""};
  md.annotations[std::string(kAnnotationDevice)] = "cpu";
  md.annotations[std::string(kAnnotationAbi)] = "1.0";
  index.manifests.push_back(md);
  // A cuda variant for the same package that a cpu device must reject.
  oci::Descriptor cd = md;
  cd.annotations[std::string(kAnnotationDevice)] = "cuda";
  cd.annotations[std::string(kAnnotationCudaVersion)] = "13.0";
  cd.annotations[std::string(kAnnotationCudaSm)] = "90";
  index.manifests.push_back(cd);
  std::string ibytes = oci::serialize(index);
  put(ibytes);
  oci::Index top;
  oci::Descriptor id = oci::describe(ibytes, oci::kMediaTypeIndex);
  id.annotations[std::string(oci::kAnnotationRefName)] = tag;
  top.manifests.push_back(id);
  fs::write_file_atomic(layout / "index.json", oci::serialize(top));
  return id.digest;
}

TEST(HubIndexProvider, ResolvesOnALayoutHub) {
  test::TempDir tmp;
  stdfs::path root = tmp.path() / "hub";
  Digest index_digest = publish(root, "org/scale", "v1", "host library v1", true);
  Store store(tmp.path() / "cache");
  HubOptions options;
  options.progress = false;
  Hub hub(HubAddress::parse(root.string(), false), store, options);
  KernelConfig config = KernelConfig::parse(R"({"Scale": {"cpu": {"train": "org/scale"}}})");
  Device device = local_cpu_device();

  // Before any pull: indexes and manifests come from the hub; kernel.json is not known yet.
  Resolution before = resolve_on_hub(config, device, Mode::kTrain, hub);
  const LayerResolution& r = before.layers.at(0);
  ASSERT_FALSE(r.fallback) << format_trace(r);
  EXPECT_EQ(r.index_digest, index_digest);
  EXPECT_EQ(r.hub_id, hub.address().id());
  EXPECT_EQ(r.variant->position, 0u);
  EXPECT_TRUE(trace_has(r.trace, "device cpu != cuda") || trace_has(r.trace, "device cuda != cpu"));
  EXPECT_TRUE(trace_has(r.trace, "kernel.json not fetched yet"));
  ASSERT_TRUE(r.package_layer);

  // Once the package is unpacked the kernel.json is read: the layer has its backward op, and the
  // unpacked files match it. (pull only caches; kernelize unpacks after the trust check.)
  hub.pull(Ref::parse("org/scale"));
  EXPECT_FALSE(store.unpacked_path(r.package_layer->digest));
  hub.unpack(r.package_layer->digest);
  Resolution after = resolve_on_hub(config, device, Mode::kTrain, hub);
  EXPECT_FALSE(after.layers.at(0).fallback);
  EXPECT_TRUE(trace_has(after.layers.at(0).trace, "layer Scale present with a backward op"))
      << format_trace(after.layers.at(0));
  auto dir = store.unpacked_path(r.package_layer->digest);
  ASSERT_TRUE(dir);
  EXPECT_NO_THROW(verify_package_files(*dir, read_package_manifest(*dir)));

  // Lock, then the hub's tag moves to other bytes: resolving under the lock names the digests.
  HubIndexProvider provider(hub);
  LockBuild built = build_lock(config, {device}, provider);
  ASSERT_TRUE(built.misses.empty());
  LockFile lock = built.lock;
  publish(root, "org/scale", "v1", "host library v2 (tampered)", true);
  Hub hub2(HubAddress::parse(root.string(), false), store, options);
  ResolveOptions locked;
  locked.lock = &lock;
  try {
    resolve_on_hub(config, device, Mode::kTrain, hub2, locked);
    ADD_FAILURE() << "accepted a moved tag under a lock";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIntegrity);
    EXPECT_NE(std::string(e.what()).find("org/scale@v1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected " + index_digest.str()), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kh
