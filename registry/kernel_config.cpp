#include "registry/kernel_config.h"

#include <fmt/format.h>

#include <set>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "registry/json_path.h"

namespace kh {

using nlohmann::json;

const char* mode_key_name(ModeKey key) {
  // Spelled out rather than through the loader's mode_name: the config parser (and its fuzz
  // target) links no loader code.
  if (key.is_fallback()) return "fallback";
  return *key.mode() == Mode::kTrain ? "train" : "eval";
}

std::optional<ModeKey> parse_mode_key(std::string_view text) {
  if (text == "eval") return ModeKey(Mode::kEval);
  if (text == "train") return ModeKey(Mode::kTrain);
  if (text == "fallback") return ModeKey::fallback();
  return std::nullopt;
}

bool is_device_key(std::string_view key) {
  for (auto k : kDeviceKeys)
    if (k == key) return true;
  return false;
}

bool is_valid_layer_name(std::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (i > 0 && ((c >= '0' && c <= '9') || c == '.' || c == '-'));
    if (!ok) return false;
  }
  return true;
}

KernelRef KernelRef::parse(std::string_view text, std::string_view default_layer) {
  auto fail = [&](const std::string& why) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("invalid kernel ref '{}': {} (expected "
                            "org/name[@TAG|@sha256:HEX][:Layer], e.g. kernel-hub/norm@v1:RMSNorm)",
                            text, why));
  };
  if (!text.empty() && (text.front() == '/' || text.front() == '.'))
    fail("local paths are not refs; serve a local package with KERNEL_HUB_LOCAL=org/name=/path");
  std::string_view ref_text = text;
  std::string_view layer = default_layer;
  // The layer suffix is the text after the last ':' unless that ':' belongs to "@sha256:".
  if (auto colon = text.rfind(':'); colon != std::string_view::npos) {
    std::string_view before = text.substr(0, colon);
    if (!before.ends_with("@sha256")) {
      ref_text = before;
      layer = text.substr(colon + 1);
      if (layer.empty()) fail("empty layer name after ':'");
    }
  }
  if (!is_valid_layer_name(layer))
    fail(fmt::format("'{}' is not a valid layer name ([A-Za-z_][A-Za-z0-9_.-]*)", layer));
  KernelRef r;
  r.ref = Ref::parse(ref_text);
  r.layer = std::string(layer);
  return r;
}

std::string CapabilityRange::str() const {
  if (max == kUnbounded) return fmt::format("[{}, any]", min);
  return fmt::format("[{}, {}]", min, max);
}

namespace {

constexpr int kMaxCapability = 10000;  // sm_1000 is far beyond any GPU; keeps widths sane

std::string list_device_keys() {
  std::string out;
  for (auto k : kDeviceKeys) out += (out.empty() ? "" : ", ") + std::string(k);
  return out;
}

class Parser {
 public:
  explicit Parser(std::string_view what) : what_(what) {}

  KernelConfig document(const json& j) {
    if (!j.is_object())
      throw_at(what_, "$",
               "expected an object of layer types, e.g. {\"RMSNorm\": \"org/norm:RMSNorm\"}, got " +
                   json_describe(j));
    KernelConfig config;
    for (auto& [name, value] : j.items()) {
      std::string path = json_path_key("$", name);
      if (name == "$schema") {
        if (!value.is_string()) throw_at(what_, path, "expected a string (the schema's URL)");
        continue;
      }
      if (!is_valid_layer_name(name))
        throw_at(
            what_, path,
            fmt::format("'{}' is not a valid layer type; expected [A-Za-z_][A-Za-z0-9_.-]*", name));
      config.layers[name] = layer(name, value, path);
    }
    return config;
  }

 private:
  LayerMapping layer(const std::string& name, const json& j, const std::string& path) {
    layer_ = name;
    LayerMapping out;
    if (is_ref_value(j)) {
      // Transformers' plain form: the same kernel for every device key, eval and train.
      CapabilityEntry e = both_modes(ref_value(j, path), path);
      for (auto k : kDeviceKeys) out.devices[std::string(k)].entries.push_back(e);
      return out;
    }
    if (!j.is_object())
      throw_at(what_, path,
               "expected a kernel ref \"org/name[@TAG][:Layer]\", [ref, {\"version\": N}] or an "
               "object of device keys (" +
                   list_device_keys() + "), got " + json_describe(j));
    if (j.empty())
      throw_at(what_, path,
               "empty object; expected at least one device key (" + list_device_keys() + ")");
    for (auto& [key, value] : j.items()) {
      std::string dpath = json_path_key(path, key);
      if (!is_device_key(key))
        throw_at(
            what_, dpath,
            fmt::format("unknown device key '{}'; expected one of: {}", key, list_device_keys()));
      out.devices[key] = device(key, value, dpath);
    }
    return out;
  }

  DeviceMapping device(const std::string& key, const json& j, const std::string& path) {
    DeviceMapping out;
    if (is_ref_value(j)) {
      out.entries.push_back(both_modes(ref_value(j, path), path));
      return out;
    }
    if (j.is_object()) {
      CapabilityEntry e;
      e.path = path;
      e.modes = mode_map(j, path);
      out.entries.push_back(std::move(e));
      return out;
    }
    if (!j.is_array())
      throw_at(what_, path,
               "expected a kernel ref, a mode map {\"eval\", \"train\", \"fallback\"} or a list "
               "of {\"capability\", \"modes\"}, got " +
                   json_describe(j));
    if (j.empty())
      throw_at(what_, path, "empty list; expected at least one {\"capability\", \"modes\"} entry");
    for (size_t i = 0; i < j.size(); ++i) {
      std::string epath = json_path_index(path, i);
      const json& e = j[i];
      if (!e.is_object())
        throw_at(what_, epath,
                 "expected {\"capability\": {\"min\", \"max\"}, \"modes\": {...}}, got " +
                     json_describe(e));
      CapabilityEntry entry;
      entry.path = epath;
      bool has_modes = false;
      for (auto& [k, v] : e.items()) {
        std::string kpath = json_path_key(epath, k);
        if (k == "capability") {
          if (key != "cuda")
            throw_at(what_, kpath,
                     fmt::format("capability ranges apply to device key cuda only, not {}", key));
          entry.range = range(v, kpath);
        } else if (k == "modes") {
          entry.modes = mode_map(v, kpath);
          has_modes = true;
        } else {
          throw_at(what_, kpath,
                   fmt::format("unknown key '{}'; expected \"capability\" or \"modes\"", k));
        }
      }
      if (!has_modes) throw_at(what_, epath, "missing \"modes\"; expected {\"eval\": ref, ...}");
      for (size_t p = 0; p < out.entries.size(); ++p) {
        if (out.entries[p].range == entry.range)
          throw_at(what_, epath,
                   fmt::format("same capability range {} as {}; expected each range once",
                               entry.range ? entry.range->str() : "(none)", out.entries[p].path));
      }
      out.entries.push_back(std::move(entry));
    }
    return out;
  }

  std::map<ModeKey, ModeEntry> mode_map(const json& j, const std::string& path) {
    if (!j.is_object())
      throw_at(what_, path,
               "expected a mode map {\"eval\": ref, \"train\": ref, \"fallback\": ref}, got " +
                   json_describe(j));
    if (j.empty())
      throw_at(what_, path, "empty mode map; expected at least one of eval, train, fallback");
    std::map<ModeKey, ModeEntry> out;
    for (auto& [k, v] : j.items()) {
      std::string mpath = json_path_key(path, k);
      auto mode = parse_mode_key(k);
      if (!mode) {
        std::string hint = (k == "capability" || k == "modes")
                               ? " (capability ranges go in a list: [{\"capability\": {...}, "
                                 "\"modes\": {...}}])"
                               : "";
        throw_at(
            what_, mpath,
            fmt::format("unknown mode '{}'; expected one of: eval, train, fallback{}", k, hint));
      }
      out[*mode] = ModeEntry{ref_value(v, mpath), mpath};
    }
    return out;
  }

  CapabilityRange range(const json& j, const std::string& path) {
    if (!j.is_object() || j.empty())
      throw_at(what_, path,
               "expected {\"min\": 80, \"max\": 89} (major*10+minor, either may be left out), "
               "got " +
                   json_describe(j));
    CapabilityRange r;
    for (auto& [k, v] : j.items()) {
      std::string kpath = json_path_key(path, k);
      if (k != "min" && k != "max")
        throw_at(what_, kpath, fmt::format("unknown key '{}'; expected \"min\" or \"max\"", k));
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxCapability)
        throw_at(what_, kpath,
                 fmt::format("expected an integer capability 0..{} (major*10+minor, e.g. 90), "
                             "got {}",
                             kMaxCapability, json_describe(v)));
      (k == "min" ? r.min : r.max) = static_cast<int>(v.get<int64_t>());
    }
    if (r.min > r.max) throw_at(what_, path, fmt::format("min {} > max {}", r.min, r.max));
    return r;
  }

  static bool is_ref_value(const json& j) {
    return j.is_string() || (j.is_array() && !j.empty() && j[0].is_string());
  }

  // "org/name[@TAG][:Layer]" or ["org/name[:Layer]", {"version": N} | {"revision": "TAG"}].
  KernelRef ref_value(const json& j, const std::string& path) {
    if (j.is_string()) return parse_ref(j.get<std::string>(), path);
    if (!j.is_array() || j.size() != 2 || !j[0].is_string() || !j[1].is_object())
      throw_at(what_, path,
               "expected a kernel ref string or [\"org/name:Layer\", {\"version\": N}], got " +
                   json_describe(j));
    std::string text = j[0].get<std::string>();
    std::string opts_path = json_path_index(path, 1);
    std::optional<std::string> tag;
    for (auto& [k, v] : j[1].items()) {
      std::string kpath = json_path_key(opts_path, k);
      if (k == "version") {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1000000)
          throw_at(what_, kpath,
                   "expected a non-negative integer version N (tag vN), got " + json_describe(v));
        if (tag) throw_at(what_, kpath, "give either \"version\" or \"revision\", not both");
        tag = "v" + std::to_string(v.get<int64_t>());
      } else if (k == "revision") {
        if (!v.is_string() || !is_valid_tag(v.get<std::string>()))
          throw_at(what_, kpath, "expected a tag string, got " + json_describe(v));
        if (tag) throw_at(what_, kpath, "give either \"version\" or \"revision\", not both");
        tag = v.get<std::string>();
      } else if (k == "trust_remote_code") {
        // Transformers' flag; trust is decided by the hub's signature policy, not per config.
        if (!v.is_boolean()) throw_at(what_, kpath, "expected true or false");
      } else {
        throw_at(what_, kpath,
                 fmt::format("unknown option '{}'; expected \"version\", \"revision\" or "
                             "\"trust_remote_code\"",
                             k));
      }
    }
    if (!tag) throw_at(what_, opts_path, "expected {\"version\": N} or {\"revision\": \"TAG\"}");
    KernelRef r = parse_ref(text, json_path_index(path, 0));
    if (text.find('@') != std::string::npos)
      throw_at(what_, json_path_index(path, 0),
               "the ref already has '@'; give the version either in the ref or in the options");
    r.ref.tag = *tag;
    r.ref.digest.reset();
    return r;
  }

  KernelRef parse_ref(const std::string& text, const std::string& path) {
    try {
      return KernelRef::parse(text, layer_);
    } catch (const Error& e) {
      throw_at(what_, path, e.what());
    }
  }

  static CapabilityEntry both_modes(KernelRef ref, const std::string& path) {
    CapabilityEntry e;
    e.path = path;
    e.modes[Mode::kEval] = ModeEntry{ref, path};
    e.modes[Mode::kTrain] = ModeEntry{std::move(ref), path};
    return e;
  }

  std::string_view what_;
  std::string layer_;
};

}  // namespace

KernelConfig KernelConfig::parse(std::string_view json_text, std::string_view what) {
  json j = parse_json_document(json_text, what);
  return Parser(what).document(j);
}

KernelConfig KernelConfig::load(const std::string& path) {
  return parse(fs::read_file(path, 4 << 20), path);
}

std::vector<Ref> KernelConfig::refs() const {
  std::map<std::string, Ref> seen;
  for (auto& [layer, lm] : layers)
    for (auto& [key, dm] : lm.devices)
      for (auto& e : dm.entries)
        for (auto& [mode, me] : e.modes) seen.emplace(me.kernel.ref.str(), me.kernel.ref);
  std::vector<Ref> out;
  for (auto& [s, r] : seen) out.push_back(r);
  return out;
}

KernelConfig merge_kernel_configs(const KernelConfig& base, const KernelConfig& overlay) {
  KernelConfig out = base;
  for (auto& [layer, lm] : overlay.layers) {
    LayerMapping& target = out.layers[layer];
    for (auto& [key, dm] : lm.devices) {
      DeviceMapping& dst = target.devices[key];
      if (key != "cuda") {
        dst = dm;
        continue;
      }
      for (auto& e : dm.entries) {
        bool replaced = false;
        for (auto& existing : dst.entries) {
          if (existing.range == e.range) {
            existing = e;
            replaced = true;
            break;
          }
        }
        if (!replaced) dst.entries.push_back(e);
      }
    }
  }
  return out;
}

}  // namespace kh
