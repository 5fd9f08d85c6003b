// KernelConfig: refs, the native form, Transformers' forms, errors with JSON paths, merging and
// scoped mappings; the shipped example configs parse.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "registry/device.h"
#include "registry/kernel_config.h"
#include "registry/kernel_mapping.h"

namespace kh {
namespace {

const ModeEntry& mode_of(const KernelConfig& c, const std::string& layer, const std::string& key,
                         size_t entry, ModeKey mode) {
  return c.layers.at(layer).devices.at(key).entries.at(entry).modes.at(mode);
}

TEST(KernelRef, Forms) {
  struct Case {
    const char* text;
    const char* repo;
    const char* tag;
    const char* layer;
  } cases[] = {
      {"org/norm", "org/norm", "v1", "RMSNorm"},
      {"org/norm:Fused", "org/norm", "v1", "Fused"},
      {"org/norm@v3", "org/norm", "v3", "RMSNorm"},
      {"org/norm@1.4.2:Fused_2", "org/norm", "1.4.2", "Fused_2"},
      {"org/sub/norm@main:X", "org/sub/norm", "main", "X"},
  };
  for (auto& c : cases) {
    KernelRef r = KernelRef::parse(c.text, "RMSNorm");
    EXPECT_EQ(r.ref.repo, c.repo) << c.text;
    EXPECT_EQ(r.ref.tag, c.tag) << c.text;
    EXPECT_EQ(r.layer, c.layer) << c.text;
    EXPECT_EQ(KernelRef::parse(r.str(), "Other"), r) << c.text;
  }
  std::string hex(64, 'a');
  KernelRef d = KernelRef::parse("org/norm@sha256:" + hex, "L");
  ASSERT_TRUE(d.ref.digest);
  EXPECT_EQ(d.ref.digest->hex, hex);
  EXPECT_EQ(d.layer, "L");
  KernelRef dl = KernelRef::parse("org/norm@sha256:" + hex + ":Layer", "L");
  ASSERT_TRUE(dl.ref.digest);
  EXPECT_EQ(dl.layer, "Layer");
}

TEST(KernelRef, Rejections) {
  for (const char* bad :
       {"", "norm", "org/norm:", "org/norm:9bad", "org/norm:La yer", "Org/norm", "org/norm@",
        "org/norm@sha256:abc", "/abs/path:Layer", "./rel:Layer", "org/norm:Layer@v1"}) {
    try {
      KernelRef::parse(bad, "RMSNorm");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << bad;
    }
  }
  try {
    KernelRef::parse("/abs/path:Layer", "X");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KERNEL_HUB_LOCAL"), std::string::npos) << e.what();
  }
}

TEST(KernelConfig, NativeForm) {
  KernelConfig c = KernelConfig::parse(R"({
    "$schema": "https://example.invalid/kernel-config.schema.json",
    "RMSNorm": {
      "cuda": [
        {"capability": {"min": 80, "max": 89}, "modes": {"eval": "org/norm-ampere@v2"}},
        {"capability": {"min": 90}, "modes": {"eval": "org/norm@v1", "train": "org/norm@v1:RMSNormTrain"}},
        {"modes": {"fallback": "org/norm-any"}}
      ],
      "cpu": {"eval": "org/norm-cpu", "fallback": ["org/norm-cpu:RMSNorm", {"version": 4}]}
    }
  })");
  ASSERT_EQ(c.layers.size(), 1u);
  const auto& cuda = c.layers.at("RMSNorm").devices.at("cuda").entries;
  ASSERT_EQ(cuda.size(), 3u);
  EXPECT_EQ(cuda[0].range, (CapabilityRange{80, 89}));
  EXPECT_EQ(cuda[1].range, (CapabilityRange{90, CapabilityRange::kUnbounded}));
  EXPECT_FALSE(cuda[2].range);
  EXPECT_EQ(cuda[1].modes.at(Mode::kTrain).kernel.layer, "RMSNormTrain");
  EXPECT_EQ(cuda[1].modes.at(Mode::kTrain).path, "$.RMSNorm.cuda[1].modes.train");
  EXPECT_EQ(cuda[0].modes.at(Mode::kEval).kernel.ref.tag, "v2");
  EXPECT_EQ(mode_of(c, "RMSNorm", "cpu", 0, ModeKey::fallback()).kernel.ref.tag, "v4");
  EXPECT_EQ(mode_of(c, "RMSNorm", "cpu", 0, Mode::kEval).kernel.layer, "RMSNorm");
  EXPECT_FALSE(c.layers.at("RMSNorm").devices.at("cpu").entries[0].modes.count(Mode::kTrain));
  std::vector<std::string> refs;
  for (auto& r : c.refs()) refs.push_back(r.str());
  EXPECT_EQ(refs, (std::vector<std::string>{"org/norm-ampere@v2", "org/norm-any@v1",
                                            "org/norm-cpu@v1", "org/norm-cpu@v4", "org/norm@v1"}));
}

// The four forms Transformers' KernelConfig uses: each means eval and train.
TEST(KernelConfig, TransformersForms) {
  struct Case {
    const char* json;
    std::vector<std::string> keys;  // device keys it lands under
    const char* ref;                // KernelRef::str()
  } cases[] = {
      {R"({"SiluAndMul": "org/act:SiluAndMul"})", {"cpu", "cuda"}, "org/act@v1:SiluAndMul"},
      {R"({"SiluAndMul": {"cuda": "org/act:Fused"}})", {"cuda"}, "org/act@v1:Fused"},
      {R"({"SiluAndMul": ["org/act:SiluAndMul", {"version": 1}]})",
       {"cpu", "cuda"},
       "org/act@v1:SiluAndMul"},
      {R"({"SiluAndMul": ["org/act", {"version": 7, "trust_remote_code": true}]})",
       {"cpu", "cuda"},
       "org/act@v7:SiluAndMul"},
      {R"({"SiluAndMul": ["org/act", {"revision": "main"}]})",
       {"cpu", "cuda"},
       "org/act@main:SiluAndMul"},
      {R"({"SiluAndMul": "org/act@rev2:SiluAndMul"})", {"cpu", "cuda"}, "org/act@rev2:SiluAndMul"},
      {R"({"SiluAndMul": {"cuda": ["org/act", {"version": 2}], "cpu": "org/act-cpu"}})",
       {"cpu", "cuda"},
       nullptr},
  };
  for (auto& c : cases) {
    KernelConfig cfg = KernelConfig::parse(c.json);
    const auto& devices = cfg.layers.at("SiluAndMul").devices;
    std::vector<std::string> keys;
    for (auto& [k, v] : devices) keys.push_back(k);
    EXPECT_EQ(keys, c.keys) << c.json;
    for (auto& [k, dm] : devices) {
      ASSERT_EQ(dm.entries.size(), 1u);
      EXPECT_FALSE(dm.entries[0].range);
      ASSERT_TRUE(dm.entries[0].modes.count(Mode::kEval)) << c.json;
      ASSERT_TRUE(dm.entries[0].modes.count(Mode::kTrain)) << c.json;
      EXPECT_FALSE(dm.entries[0].modes.count(ModeKey::fallback()));
      if (c.ref) {
        EXPECT_EQ(dm.entries[0].modes.at(Mode::kEval).kernel.str(), c.ref);
      }
    }
  }
}

// Each error names the JSON path and what was expected.
TEST(KernelConfig, ErrorsNameJsonPath) {
  struct Case {
    const char* json;
    const char* expect;  // substring of the message
  } cases[] = {
      {R"([])", "$: expected an object of layer types"},
      {R"({"RMSNorm": {"gpu": "org/x"}})",
       "$.RMSNorm.gpu: unknown device key 'gpu'; expected one of: cuda, cpu (served), or rocm, "
       "xpu, npu, mps, metal, neuron, tpu (kept for other systems, skipped here)"},
      {R"({"RMSNorm": {"cuda": [{"capability": {"min": 90, "max": 80}, "modes": {"eval": "org/x"}}]}})",
       "$.RMSNorm.cuda[0].capability: min 90 > max 80"},
      {R"({"RMSNorm": {"cuda": [{"modes": {"eval": "org/x"}}, {"capability": {"min": 90, "max": 80}, "modes": {"eval": "org/x"}}]}})",
       "$.RMSNorm.cuda[1].capability: min 90 > max 80"},
      {R"({"RMSNorm": {"cuda": {"inference": "org/x"}}})",
       "$.RMSNorm.cuda.inference: unknown mode 'inference'; expected one of: eval, train, "
       "fallback"},
      {R"({"RMSNorm": {"cuda": {"eval": "org/X Y"}}})",
       "$.RMSNorm.cuda.eval: invalid ref 'org/x y'"},
      {R"({"RMSNorm": {"cuda": {"eval": "org/x:"}}})", "$.RMSNorm.cuda.eval: invalid kernel ref"},
      {R"({"RMSNorm": {"cpu": [{"capability": {"min": 80}, "modes": {"eval": "org/x"}}]}})",
       "$.RMSNorm.cpu[0].capability: capability ranges apply to device key cuda only"},
      {R"({"RMSNorm": {"cuda": [{"capability": {"min": "80"}, "modes": {"eval": "org/x"}}]}})",
       "$.RMSNorm.cuda[0].capability.min: expected an integer capability"},
      {R"({"RMSNorm": {"cuda": [{"capability": {"lo": 80}, "modes": {"eval": "org/x"}}]}})",
       "$.RMSNorm.cuda[0].capability.lo: unknown key 'lo'"},
      {R"({"RMSNorm": {"cuda": [{"capability": {"min": 80}}]}})",
       "$.RMSNorm.cuda[0]: missing \"modes\""},
      {R"({"RMSNorm": {"cuda": [{"modes": {"eval": "org/x"}}, {"modes": {"eval": "org/y"}}]}})",
       "$.RMSNorm.cuda[1]: same capability range"},
      {R"({"RMSNorm": {"cuda": {"capability": {"min": 80}, "modes": {}}}})",
       "capability ranges go in a list"},
      {R"({"RMSNorm": ["org/x", {"version": -1}]})",
       "$.RMSNorm[1].version: expected a non-negative"},
      {R"({"RMSNorm": ["org/x", {"version": 1.5}]})", "$.RMSNorm[1].version"},
      {R"({"RMSNorm": ["org/x@v2", {"version": 1}]})", "$.RMSNorm[0]: the ref already has '@'"},
      {R"({"RMSNorm": ["org/x", {}]})", "$.RMSNorm[1]: expected {\"version\": N}"},
      {R"({"RMSNorm": ["org/x", {"version": 1, "revision": "a"}]})", "not both"},
      {R"({"RMSNorm": ["org/x", {"pin": 1}]})", "$.RMSNorm[1].pin: unknown option 'pin'"},
      {R"({"RMSNorm": 5})", "$.RMSNorm: expected a kernel ref"},
      {R"({"RMSNorm": {}})", "$.RMSNorm: empty object"},
      {R"({"RMSNorm": {"cuda": []}})", "$.RMSNorm.cuda: empty list"},
      {R"({"RMSNorm": {"cuda": {}}})", "$.RMSNorm.cuda: empty mode map"},
      {R"({"9bad": "org/x"})", "$[\"9bad\"]: '9bad' is not a valid layer type"},
      {R"({"RMSNorm": {"cuda": {"eval": "./opt/k:RMSNorm"}}})", "a local path must be absolute"},
      {R"({"RMSNorm": {"cuda": {"eval": "/opt/k:9bad"}}})", "expected /abs/path/NAME:Layer"},
      {R"({"A": {"cuda": {"eval": "/x/k:A"}}, "B": {"cuda": {"eval": "/y/k:B"}}})",
       "would both be served as local/k"},
      {R"({"RMSNorm": {"cuda": {"TORCH_COMPILE": "org/x"}}})",
       "$.RMSNorm.cuda.TORCH_COMPILE: mode 'TORCH_COMPILE' refused: TORCH_COMPILE alone names no "
       "mode"},
      {R"({"RMSNorm": {"cuda": {"INFERENCE | TRAINING": "org/x"}}})",
       "INFERENCE and TRAINING are mutually exclusive"},
      {R"({"RMSNorm": {"cuda": {"FALLBACK | TORCH_COMPILE": "org/x"}}})",
       "FALLBACK cannot be combined"},
      {R"({"RMSNorm": {"cuda": {"eval": "org/x", "INFERENCE": "org/y"}}})",
       "same mode (eval) as $.RMSNorm.cuda."},
      {R"({"RMSNorm": {"cuda": {"INFERNECE": "org/x"}}})", "unknown mode 'INFERNECE'"},
      {R"({"RMSNorm": {"cuda": [{"capability": {"min": 80}, "min_capability": 80, "modes": {"eval": "org/x"}}]}})",
       "give the range once"},
      {R"({"RMSNorm": {"rocm": [{"min_capability": 80, "modes": {"eval": "org/x"}}]}})",
       "capability ranges apply to device key cuda only, not rocm"},
      {R"({"RMSNorm": ["org/x", {"version": ">=1.0.0,<2.0.0"}]})",
       "version specifier \">=1.0.0,<2.0.0\" is not resolved"},
      {R"({"RMSNorm": )", "not valid JSON at byte"},
      {R"({"RMSNorm": 1e99999})", "not valid JSON"},  // out_of_range, found by fuzzing
  };
  for (auto& c : cases) {
    try {
      KernelConfig::parse(c.json, "cfg.json");
      ADD_FAILURE() << "accepted " << c.json;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      std::string msg = e.what();
      EXPECT_NE(msg.find(c.expect), std::string::npos)
          << "message: " << msg << "\nwant: " << c.expect;
      EXPECT_EQ(msg.rfind("cfg.json: ", 0), 0u) << msg;
    }
  }
}

KernelConfig parse(const char* json) {
  return KernelConfig::parse(json);
}

bool has_note(const KernelConfig& c, std::string_view text) {
  for (auto& n : c.notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

// Device keys of other accelerators are kept (for merging, for other systems) and noted; the
// whole config is not refused.
TEST(KernelConfigCompat, OtherDeviceKeysKeptAndNoted) {
  KernelConfig c = parse(R"({"RMSNorm": {"rocm": "org/x:RMSNorm", "xpu": "org/x", "npu": "org/x",
                                         "mps": "org/x", "metal": "org/x", "neuron": "org/x",
                                         "tpu": "org/x", "cuda": "org/x"}})");
  const auto& devices = c.layers.at("RMSNorm").devices;
  EXPECT_EQ(devices.size(), 8u);
  for (auto key : kOtherDeviceKeys) {
    EXPECT_TRUE(devices.count(std::string(key))) << key;
    EXPECT_TRUE(has_note(c, fmt::format("$.RMSNorm.{}: device key {} kept but skipped on this "
                                        "system",
                                        key, key)))
        << key;
  }
  EXPECT_FALSE(has_note(c, "$.RMSNorm.cuda"));
}

// kernels' Mode names: mapped to eval/train/fallback; the TORCH_COMPILE forms map to the same
// mode and lose to the plain spelling (kernels' mode priority), with a note.
TEST(KernelConfigCompat, ModeNamesMapped) {
  struct Case {
    const char* key;
    ModeKey mode;
  } cases[] = {
      {"INFERENCE", Mode::kEval},
      {"TRAINING", Mode::kTrain},
      {"FALLBACK", ModeKey::fallback()},
      {"INFERENCE | TORCH_COMPILE", Mode::kEval},
      {"TRAINING|TORCH_COMPILE", Mode::kTrain},
      {"Mode.TRAINING | Mode.TORCH_COMPILE", Mode::kTrain},
      {"TORCH_COMPILE | INFERENCE", Mode::kEval},
  };
  for (auto& c : cases) {
    std::string json = fmt::format(R"({{"L": {{"cuda": {{"{}": "org/x"}}}}}})", c.key);
    KernelConfig cfg = KernelConfig::parse(json);
    const auto& modes = cfg.layers.at("L").devices.at("cuda").entries.at(0).modes;
    ASSERT_EQ(modes.size(), 1u) << c.key;
    EXPECT_TRUE(modes.count(c.mode)) << c.key;
  }
  KernelConfig both = parse(R"({"L": {"cuda": {"INFERENCE | TORCH_COMPILE": "org/compiled",
                                               "INFERENCE": "org/plain",
                                               "TRAINING | TORCH_COMPILE": "org/train"}}})");
  const auto& modes = both.layers.at("L").devices.at("cuda").entries.at(0).modes;
  EXPECT_EQ(modes.at(Mode::kEval).kernel.ref.repo, "org/plain");
  EXPECT_EQ(modes.at(Mode::kTrain).kernel.ref.repo, "org/train");
  EXPECT_TRUE(has_note(both, "$.L.cuda[\"INFERENCE | TORCH_COMPILE\"]: not used"));
  // The plain spelling wins whichever comes first in the document.
  KernelConfig plain_first = parse(R"({"L": {"cuda": {"INFERENCE": "org/plain",
                                                      "INFERENCE|TORCH_COMPILE": "org/c"}}})");
  EXPECT_EQ(plain_first.layers.at("L")
                .devices.at("cuda")
                .entries.at(0)
                .modes.at(Mode::kEval)
                .kernel.ref.repo,
            "org/plain");
}

// kernels' CUDAProperties names, in "capability", "properties" or the entry itself.
TEST(KernelConfigCompat, CapabilityNamesMapped) {
  for (
      const char* entry :
      {R"({"capability": {"min_capability": 80, "max_capability": 89}, "modes": {"eval": "org/x"}})",
       R"({"properties": {"min_capability": 80, "max_capability": 89}, "modes": {"eval": "org/x"}})",
       R"({"min_capability": 80, "max_capability": 89, "modes": {"eval": "org/x"}})"}) {
    KernelConfig c = KernelConfig::parse(fmt::format(R"({{"L": {{"cuda": [{}]}}}})", entry));
    const auto& e = c.layers.at("L").devices.at("cuda").entries.at(0);
    ASSERT_TRUE(e.range) << entry;
    EXPECT_EQ(*e.range, (CapabilityRange{80, 89})) << entry;
  }
  KernelConfig open =
      parse(R"({"L": {"cuda": [{"min_capability": 90, "modes": {"eval": "org/x"}}]}})");
  EXPECT_EQ(*open.layers.at("L").devices.at("cuda").entries.at(0).range,
            (CapabilityRange{90, CapabilityRange::kUnbounded}));
}

// Repository names: lowercased with a note (OCI names are lowercase); tag and layer keep case.
TEST(KernelConfigCompat, RepositoryNamesLowercased) {
  KernelConfig c = parse(R"({"RMSNorm": {"cuda": "Kernels-Community/LayerNorm@V2:LlamaRMSNorm",
                                         "cpu": ["MyOrg/Norm:RMSNorm", {"version": 3}]}})");
  const KernelRef& k =
      c.layers.at("RMSNorm").devices.at("cuda").entries[0].modes.at(Mode::kEval).kernel;
  EXPECT_EQ(k.ref.repo, "kernels-community/layernorm");
  EXPECT_EQ(k.ref.tag, "V2");
  EXPECT_EQ(k.layer, "LlamaRMSNorm");
  EXPECT_EQ(c.layers.at("RMSNorm").devices.at("cpu").entries[0].modes.at(Mode::kEval).kernel.str(),
            "myorg/norm@v3:RMSNorm");
  EXPECT_TRUE(has_note(c,
                       "$.RMSNorm.cuda: repository Kernels-Community/LayerNorm looked up as "
                       "kernels-community/layernorm"));
  EXPECT_TRUE(has_note(c, "repository MyOrg/Norm looked up as myorg/norm"));
  EXPECT_TRUE(parse(R"({"L": "org/x"})").notes.empty());
}

// Transformers' local form "/abs/path/NAME:Layer": served as repo local/NAME from that directory.
TEST(KernelConfigCompat, LocalPathsServedAsLocalRepos) {
  KernelConfig c = parse(R"({"RMSNorm": "/home/me/Liger_Kernels:LigerRMSNorm",
                            "Silu": {"cuda": "/home/me/Liger_Kernels:Silu", "cpu": "/opt/act/"}})");
  const KernelRef& k =
      c.layers.at("RMSNorm").devices.at("cuda").entries[0].modes.at(Mode::kEval).kernel;
  EXPECT_EQ(k.ref.repo, "local/liger_kernels");
  EXPECT_EQ(k.layer, "LigerRMSNorm");
  EXPECT_EQ(c.local_packages.at("local/liger_kernels"), "/home/me/Liger_Kernels");
  EXPECT_EQ(c.layers.at("Silu").devices.at("cpu").entries[0].modes.at(Mode::kEval).kernel.str(),
            "local/act@v1:Silu");
  EXPECT_EQ(c.local_packages.at("local/act"), "/opt/act/");
  // Merged mappings keep both sides' local packages.
  KernelConfig m = merge_kernel_configs(parse(R"({"A": "/x/a:A"})"), c);
  EXPECT_EQ(m.local_packages.size(), 3u);
}

// kernels' LayerRepository version strings: "N" is channel vN, an exact version its tag;
// revisions are kept as written (resolution says when one is a branch or a commit).
TEST(KernelConfigCompat, VersionAndRevisionForms) {
  auto ref_of = [](const char* json) {
    return KernelConfig::parse(json)
        .layers.at("L")
        .devices.at("cpu")
        .entries[0]
        .modes.at(Mode::kEval)
        .kernel.ref;
  };
  EXPECT_EQ(ref_of(R"({"L": ["org/x", {"version": "2"}]})").tag, "v2");
  EXPECT_EQ(ref_of(R"({"L": ["org/x", {"version": "1.4.2"}]})").tag, "1.4.2");
  EXPECT_EQ(ref_of(R"({"L": ["org/x", {"revision": "main"}]})").tag, "main");
  EXPECT_EQ(
      ref_of(R"({"L": ["org/x", {"revision": "0123456789abcdef0123456789abcdef01234567"}]})").tag,
      "0123456789abcdef0123456789abcdef01234567");
}

TEST(KernelConfig, MergeReplacesSameRangeAndAppendsOthers) {
  KernelConfig base = parse(R"({
    "A": {"cuda": [{"capability": {"min": 80, "max": 89}, "modes": {"eval": "org/a80"}},
                   {"modes": {"eval": "org/aany"}}],
          "cpu": {"eval": "org/acpu", "train": "org/acpu"}},
    "B": "org/b"})");
  KernelConfig overlay = parse(R"({
    "A": {"cuda": [{"capability": {"min": 80, "max": 89}, "modes": {"train": "org/a80new"}},
                   {"capability": {"min": 90, "max": 90}, "modes": {"eval": "org/a90"}}],
          "cpu": {"fallback": "org/acpu2"}}})");
  KernelConfig m = merge_kernel_configs(base, overlay);
  const auto& cuda = m.layers.at("A").devices.at("cuda").entries;
  ASSERT_EQ(cuda.size(), 3u);
  EXPECT_EQ(cuda[0].modes.size(), 1u);  // replaced whole, as HF re-inserting an interval
  EXPECT_EQ(cuda[0].modes.at(Mode::kTrain).kernel.ref.repo, "org/a80new");
  EXPECT_EQ(cuda[2].range, (CapabilityRange{90, 90}));
  const auto& cpu = m.layers.at("A").devices.at("cpu").entries;
  ASSERT_EQ(cpu.size(), 1u);  // cpu: the overlay replaces the device's mapping
  EXPECT_EQ(cpu[0].modes.size(), 1u);
  EXPECT_TRUE(cpu[0].modes.count(ModeKey::fallback()));
  EXPECT_TRUE(m.layers.count("B"));
}

TEST(KernelMapping, ScopesInheritReplaceAndRestore) {
  clear_kernel_mapping();
  register_kernel_mapping(parse(R"({"A": "org/a", "B": "org/b"})"));
  register_kernel_mapping(parse(R"({"C": "org/c"})"));  // inherit: merged
  EXPECT_EQ(current_kernel_mapping()->layers.size(), 3u);
  {
    ScopedKernelMapping inherit(parse(R"({"A": "org/a2", "D": "org/d"})"));
    auto cur = current_kernel_mapping();
    EXPECT_EQ(cur->layers.size(), 4u);
    EXPECT_EQ(mode_of(*cur, "A", "cpu", 0, Mode::kEval).kernel.ref.repo, "org/a2");
    {
      ScopedKernelMapping replace(parse(R"({"E": "org/e"})"), MappingMerge::kReplace);
      EXPECT_EQ(current_kernel_mapping()->layers.size(), 1u);
      EXPECT_TRUE(current_kernel_mapping()->layers.count("E"));
      // Other threads see the base, not this thread's overlays.
      size_t other = 0;
      std::thread t([&] { other = current_kernel_mapping()->layers.size(); });
      t.join();
      EXPECT_EQ(other, 3u);
    }
    EXPECT_EQ(current_kernel_mapping()->layers.size(), 4u);
    // A snapshot taken in a scope stays valid after the scope.
    EXPECT_TRUE(cur->layers.count("D"));
  }
  auto after = current_kernel_mapping();
  EXPECT_EQ(after->layers.size(), 3u);
  EXPECT_EQ(mode_of(*after, "A", "cpu", 0, Mode::kEval).kernel.ref.repo, "org/a");
  register_kernel_mapping(parse(R"({"Z": "org/z"})"), MappingMerge::kReplace);
  EXPECT_EQ(current_kernel_mapping()->layers.size(), 1u);
  clear_kernel_mapping();
  EXPECT_TRUE(current_kernel_mapping()->empty());
}

TEST(KernelConfig, ShippedExamplesParse) {
  auto dir = std::filesystem::path(KH_SOURCE_DIR) / "manifests" / "examples";
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (!name.starts_with("kernel-config")) continue;
    SCOPED_TRACE(name);
    KernelConfig c = KernelConfig::load(e.path().string());
    EXPECT_FALSE(c.empty());
    ++n;
  }
  EXPECT_GE(n, 2);
}

}  // namespace
}  // namespace kh

namespace kh {

TEST(Device, LocalGpuIsReadFromTheDriverOrFailsClearly) {
  // Hide any driver: this test is about the message on a machine without one.
  setenv("KERNEL_HUB_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  try {
    make_device(DeviceFields{"cuda:0", std::nullopt, std::nullopt, std::nullopt, std::nullopt});
    ADD_FAILURE() << "cuda:0 resolved without a driver";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("cannot read GPU 0 from the driver"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("--device cuda --sm NN --cuda X.Y"), std::string::npos);
  }
  unsetenv("KERNEL_HUB_LIBCUDA");
  // By hand, a cuda device needs no GPU.
  Device d = make_device(DeviceFields{"cuda", "90", "13.0", std::nullopt, std::nullopt});
  EXPECT_EQ(d.sm, 90);
  EXPECT_THROW(
      make_device(DeviceFields{"cuda:x", std::nullopt, std::nullopt, std::nullopt, std::nullopt}),
      Error);
  EXPECT_THROW(make_device(DeviceFields{"cuda:0", "90", std::nullopt, std::nullopt, std::nullopt}),
               Error);
}

}  // namespace kh
