#include "registry/kernel_config.h"

#include <fmt/format.h>

#include <algorithm>
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

bool is_other_device_key(std::string_view key) {
  for (auto k : kOtherDeviceKeys)
    if (k == key) return true;
  return false;
}

std::optional<ConfigModeKey> parse_config_mode_key(std::string_view text, std::string* why) {
  if (auto native = parse_mode_key(text)) return ConfigModeKey{*native, false};
  // kernels' Mode flags: "INFERENCE", "Mode.TRAINING | Mode.TORCH_COMPILE", ...
  bool inference = false, training = false, fallback = false, compile = false;
  size_t start = 0;
  while (start <= text.size()) {
    size_t bar = text.find('|', start);
    if (bar == std::string_view::npos) bar = text.size();
    std::string_view token = text.substr(start, bar - start);
    while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
    while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
    if (token.starts_with("Mode.")) token.remove_prefix(5);
    if (token == "INFERENCE")
      inference = true;
    else if (token == "TRAINING")
      training = true;
    else if (token == "FALLBACK")
      fallback = true;
    else if (token == "TORCH_COMPILE")
      compile = true;
    else
      return std::nullopt;
    start = bar + 1;
  }
  auto refuse = [&](const char* reason) -> std::optional<ConfigModeKey> {
    if (why) *why = reason;
    return std::nullopt;
  };
  if (inference && training) return refuse("INFERENCE and TRAINING are mutually exclusive");
  if (fallback && (inference || training || compile))
    return refuse("FALLBACK cannot be combined with other modes");
  if (fallback) return ConfigModeKey{ModeKey::fallback(), false};
  if (!inference && !training)
    return refuse(
        "TORCH_COMPILE alone names no mode; use INFERENCE | TORCH_COMPILE or "
        "TRAINING | TORCH_COMPILE");
  return ConfigModeKey{ModeKey(inference ? Mode::kEval : Mode::kTrain), compile};
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

std::string list_other_device_keys() {
  std::string out;
  for (auto k : kOtherDeviceKeys) out += (out.empty() ? "" : ", ") + std::string(k);
  return out;
}

bool has_upper(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return c >= 'A' && c <= 'Z'; });
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

// The repo a local package directory is served as: local/<last path component>, lowercased and
// with characters OCI names do not allow replaced by '-'.
std::string local_repo_name(std::string_view dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  std::string name = lower(dir.substr(dir.rfind('/') + 1));
  for (char& c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      c = '-';
  while (!name.empty() && !((name.front() >= 'a' && name.front() <= 'z') ||
                            (name.front() >= '0' && name.front() <= '9')))
    name.erase(0, 1);
  while (!name.empty() && !((name.back() >= 'a' && name.back() <= 'z') ||
                            (name.back() >= '0' && name.back() <= '9')))
    name.pop_back();
  return "local/" + (name.empty() ? std::string("package") : name);
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
    config.notes = std::move(notes_);
    config.local_packages = std::move(local_packages_);
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
                   list_device_keys() + ", or " + list_other_device_keys() + "), got " +
                   json_describe(j));
    if (j.empty())
      throw_at(what_, path,
               "empty object; expected at least one device key (" + list_device_keys() + ")");
    for (auto& [key, value] : j.items()) {
      std::string dpath = json_path_key(path, key);
      if (is_other_device_key(key)) {
        notes_.push_back(
            fmt::format("{}: device key {} kept but skipped on this system (kernel-hub serves {})",
                        dpath, key, list_device_keys()));
      } else if (!is_device_key(key)) {
        throw_at(what_, dpath,
                 fmt::format("unknown device key '{}'; expected one of: {} (served), or {} (kept "
                             "for other systems, skipped here)",
                             key, list_device_keys(), list_other_device_keys()));
      }
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
      // kernels' CUDAProperties names may stand in the entry itself.
      json inline_range = json::object();
      for (auto& [k, v] : e.items()) {
        std::string kpath = json_path_key(epath, k);
        if (k == "capability" || k == "properties" || k == "min_capability" ||
            k == "max_capability") {
          if (key != "cuda")
            throw_at(what_, kpath,
                     fmt::format("capability ranges apply to device key cuda only, not {}", key));
          if (entry.range || (!inline_range.empty() && !k.ends_with("_capability")))
            throw_at(what_, kpath,
                     "give the range once: \"capability\", \"properties\" or "
                     "\"min_capability\"/\"max_capability\"");
          if (k.ends_with("_capability"))
            inline_range[k] = v;
          else
            entry.range = range(v, kpath);
        } else if (k == "modes") {
          entry.modes = mode_map(v, kpath);
          has_modes = true;
        } else {
          throw_at(what_, kpath,
                   fmt::format("unknown key '{}'; expected \"capability\" (or "
                               "\"min_capability\"/\"max_capability\") or \"modes\"",
                               k));
        }
      }
      if (!inline_range.empty()) {
        if (entry.range)
          throw_at(what_, epath,
                   "give the range once: \"capability\", \"properties\" or "
                   "\"min_capability\"/\"max_capability\"");
        entry.range = range(inline_range, epath);
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
    std::map<ModeKey, bool> compiled;  // the entry came from a "| TORCH_COMPILE" spelling
    for (auto& [k, v] : j.items()) {
      std::string mpath = json_path_key(path, k);
      std::string why;
      auto mode = parse_config_mode_key(k, &why);
      if (!mode && !why.empty())
        throw_at(what_, mpath, fmt::format("mode '{}' refused: {}", k, why));
      if (!mode) {
        std::string hint = (k == "capability" || k == "modes")
                               ? " (capability ranges go in a list: [{\"capability\": {...}, "
                                 "\"modes\": {...}}])"
                               : "";
        throw_at(what_, mpath,
                 fmt::format("unknown mode '{}'; expected one of: eval, train, fallback (or "
                             "kernels' INFERENCE, TRAINING, FALLBACK, with | TORCH_COMPILE){}",
                             k, hint));
      }
      ModeEntry entry{ref_value(v, mpath), mpath};
      auto have = out.find(mode->key);
      if (have == out.end()) {
        out.emplace(mode->key, std::move(entry));
        compiled[mode->key] = mode->torch_compile;
        continue;
      }
      if (compiled[mode->key] == mode->torch_compile)
        throw_at(what_, mpath,
                 fmt::format("same mode ({}) as {}; expected each mode once",
                             mode_key_name(mode->key), have->second.path));
      // kernels tries the plain mode before its TORCH_COMPILE form: the plain spelling serves.
      const std::string& loser = mode->torch_compile ? mpath : have->second.path;
      const std::string& winner = mode->torch_compile ? have->second.path : mpath;
      notes_.push_back(
          fmt::format("{}: not used: {} maps to the same mode ({}) and wins, as "
                      "kernels tries the plain mode before its TORCH_COMPILE form",
                      loser, winner, mode_key_name(mode->key)));
      if (!mode->torch_compile) {
        have->second = std::move(entry);
        compiled[mode->key] = false;
      }
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
      bool is_min = k == "min" || k == "min_capability";
      if (!is_min && k != "max" && k != "max_capability")
        throw_at(what_, kpath,
                 fmt::format("unknown key '{}'; expected \"min\" or \"max\" (or kernels' "
                             "\"min_capability\", \"max_capability\")",
                             k));
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxCapability)
        throw_at(what_, kpath,
                 fmt::format("expected an integer capability 0..{} (major*10+minor, e.g. 90), "
                             "got {}",
                             kMaxCapability, json_describe(v)));
      (is_min ? r.min : r.max) = static_cast<int>(v.get<int64_t>());
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
        if (tag) throw_at(what_, kpath, "give either \"version\" or \"revision\", not both");
        tag = version_tag(v, kpath);
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

  // {"version": N} is channel vN; kernels also takes a string: "N" (channel) or an exact
  // "MAJOR.MINOR.PATCH" (that tag). Range specifiers are not resolved here.
  std::string version_tag(const json& v, const std::string& path) {
    if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= 1000000)
      return "v" + std::to_string(v.get<int64_t>());
    if (v.is_string()) {
      const std::string& s = v.get<std::string>();
      bool digits = !s.empty() && s.size() <= 7 &&
                    std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits) return "v" + s;
      int parts = 0;
      bool exact = !s.empty() && s.size() <= 32;
      for (size_t i = 0; exact && i < s.size(); ++i) {
        if (s[i] == '.')
          exact = i > 0 && s[i - 1] != '.';
        else
          exact = s[i] >= '0' && s[i] <= '9';
        parts += s[i] == '.';
      }
      if (exact && parts == 2 && s.back() != '.') return s;
      throw_at(what_, path,
               fmt::format("version specifier {} is not resolved by kernel-hub; give "
                           "{{\"version\": N}} (channel vN) or an exact \"MAJOR.MINOR.PATCH\" "
                           "(list them with kernel-hub versions ORG/NAME)",
                           json_short(v)));
    }
    throw_at(what_, path,
             "expected a non-negative integer version N (tag vN) or a version string, got " +
                 json_describe(v));
  }

  KernelRef parse_ref(const std::string& text, const std::string& path) {
    if (!text.empty() && text.front() == '.')
      throw_at(what_, path,
               fmt::format("'{}': a local path must be absolute (/abs/path/NAME:Layer, as "
                           "Transformers requires), or serve the directory with "
                           "KERNEL_HUB_LOCAL=org/name=/path",
                           text));
    if (!text.empty() && text.front() == '/') return local_ref(text, path);
    std::string ref_text = text;
    size_t repo_end = std::min(text.find('@'), text.find(':'));
    std::string_view repo = std::string_view(text).substr(0, repo_end);
    if (has_upper(repo)) {
      ref_text = lower(repo) + text.substr(std::min(repo_end, text.size()));
      notes_.push_back(
          fmt::format("{}: repository {} looked up as {} (OCI repository names are "
                      "lowercase)",
                      path, repo, lower(repo)));
    }
    try {
      return KernelRef::parse(ref_text, layer_);
    } catch (const Error& e) {
      throw_at(what_, path, e.what());
    }
  }

  // Transformers' use_local_kernel form: "/abs/path/NAME:Layer".
  KernelRef local_ref(const std::string& text, const std::string& path) {
    std::string dir = text;
    std::string layer = layer_;
    if (auto colon = text.rfind(':'); colon != std::string::npos) {
      dir = text.substr(0, colon);
      layer = text.substr(colon + 1);
    }
    if (dir.size() < 2 || !is_valid_layer_name(layer))
      throw_at(what_, path,
               fmt::format("local path '{}': expected /abs/path/NAME:Layer", json_short(text)));
    std::string repo = local_repo_name(dir);
    auto [it, added] = local_packages_.emplace(repo, dir);
    if (!added && it->second != dir)
      throw_at(what_, path,
               fmt::format("local path {} and {} would both be served as {}; rename one "
                           "directory",
                           dir, it->second, repo));
    KernelRef r;
    r.ref = Ref::parse(repo);
    r.layer = layer;
    return r;
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
  std::vector<std::string> notes_;
  std::map<std::string, std::string> local_packages_;
};

}  // namespace

KernelConfig KernelConfig::parse(std::string_view json_text, std::string_view what) {
  json j = parse_json_document(json_text, what);
  return Parser(what).document(j);
}

KernelConfig KernelConfig::load(const std::string& path) {
  return parse(fs::read_input_file(path, 4 << 20,
                                   "a KernelConfig JSON file mapping layers to kernel refs, as "
                                   "manifests/examples/kernel-config.json"),
               path);
}

std::vector<Ref> KernelConfig::refs() const {
  std::map<std::string, Ref> seen;
  for (auto& [layer, lm] : layers)
    for (auto& [key, dm] : lm.devices) {
      if (!is_device_key(key)) continue;  // other accelerators' entries are not served here
      for (auto& e : dm.entries)
        for (auto& [mode, me] : e.modes) seen.emplace(me.kernel.ref.str(), me.kernel.ref);
    }
  std::vector<Ref> out;
  for (auto& [s, r] : seen) out.push_back(r);
  return out;
}

KernelConfig merge_kernel_configs(const KernelConfig& base, const KernelConfig& overlay) {
  KernelConfig out = base;
  for (auto& [repo, dir] : overlay.local_packages) out.local_packages[repo] = dir;
  out.notes.insert(out.notes.end(), overlay.notes.begin(), overlay.notes.end());
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
