#include "registry/lock_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "registry/device.h"
#include "registry/json_path.h"

namespace kh {

using nlohmann::json;

namespace {

constexpr uint64_t kMaxLockBytes = 16 << 20;

class Parser {
 public:
  explicit Parser(std::string_view what) : what_(what) {}

  LockFile document(const json& j) {
    if (!j.is_object())
      throw_at(what_, "$",
               "expected {\"version\": 1, \"entries\": [...]}, got " + json_describe(j));
    LockFile lock;
    bool has_version = false, has_entries = false;
    for (auto& [k, v] : j.items()) {
      std::string kpath = json_path_key("$", k);
      if (k == "version") {
        if (!v.is_number_integer() || v.get<int64_t>() != LockFile::kVersion)
          throw_at(what_, kpath,
                   fmt::format("unsupported lock file version {}; expected 1 (re-run kernel-hub "
                               "lock with this kernel-hub)",
                               json_short(v)));
        has_version = true;
      } else if (k == "entries") {
        if (!v.is_array()) throw_at(what_, kpath, "expected a list, got " + json_describe(v));
        for (size_t i = 0; i < v.size(); ++i) {
          LockEntry e = entry(v[i], json_path_index(kpath, i));
          for (auto& prior : lock.entries)
            if (prior.ref.str() == e.ref.str())
              throw_at(
                  what_, json_path_index(kpath, i),
                  fmt::format("ref {} is locked twice; expected one entry per ref", e.ref.str()));
          lock.entries.push_back(std::move(e));
        }
        has_entries = true;
      } else {
        throw_at(what_, kpath, fmt::format("unknown key '{}'; expected version, entries", k));
      }
    }
    if (!has_version) throw_at(what_, "$.version", "missing; expected 1");
    if (!has_entries) throw_at(what_, "$.entries", "missing; expected a list");
    return lock;
  }

 private:
  LockEntry entry(const json& j, const std::string& path) {
    if (!j.is_object())
      throw_at(
          what_, path,
          "expected {\"ref\", \"hub\", \"index_digest\", \"targets\"}, got " + json_describe(j));
    LockEntry e;
    bool has[4] = {};
    for (auto& [k, v] : j.items()) {
      std::string kpath = json_path_key(path, k);
      if (k == "ref") {
        if (!v.is_string())
          throw_at(what_, kpath, "expected a ref string, got " + json_describe(v));
        try {
          e.ref = Ref::parse(v.get<std::string>());
        } catch (const Error& err) {
          throw_at(what_, kpath, err.what());
        }
        has[0] = true;
      } else if (k == "hub") {
        if (!v.is_string() || v.get<std::string>().empty())
          throw_at(what_, kpath, "expected the hub id string, got " + json_describe(v));
        e.hub = v.get<std::string>();
        has[1] = true;
      } else if (k == "index_digest") {
        e.index_digest = digest(v, kpath);
        has[2] = true;
      } else if (k == "targets") {
        if (!v.is_object())
          throw_at(what_, kpath, "expected {\"<device>\": {...}}, got " + json_describe(v));
        for (auto& [dev, t] : v.items()) {
          std::string tpath = json_path_key(kpath, dev);
          try {
            if (parse_device_spec(dev).str() != dev) throw Error(ErrorKind::kInvalidInput, "");
          } catch (const Error&) {
            throw_at(what_, tpath,
                     fmt::format("'{}' is not a device; expected e.g. "
                                 "cuda:sm_90:cuda_13.0:linux/amd64 or cpu:linux/amd64",
                                 dev));
          }
          e.targets[dev] = target(t, tpath);
        }
        has[3] = true;
      } else {
        throw_at(what_, kpath,
                 fmt::format("unknown key '{}'; expected ref, hub, index_digest, targets", k));
      }
    }
    const char* names[4] = {"ref", "hub", "index_digest", "targets"};
    for (int i = 0; i < 4; ++i)
      if (!has[i]) throw_at(what_, json_path_key(path, names[i]), "missing");
    return e;
  }

  LockTarget target(const json& j, const std::string& path) {
    if (!j.is_object())
      throw_at(what_, path,
               "expected {\"manifest_digest\", \"layer_digest\", \"layer_size\"}, got " +
                   json_describe(j));
    LockTarget t;
    bool has[3] = {};
    for (auto& [k, v] : j.items()) {
      std::string kpath = json_path_key(path, k);
      if (k == "manifest_digest") {
        t.manifest_digest = digest(v, kpath);
        has[0] = true;
      } else if (k == "layer_digest") {
        t.layer_digest = digest(v, kpath);
        has[1] = true;
      } else if (k == "layer_size") {
        if (!v.is_number_integer() || v.get<int64_t>() < 0)
          throw_at(what_, kpath, "expected a byte count >= 0, got " + json_describe(v));
        t.layer_size = v.get<int64_t>();
        has[2] = true;
      } else {
        throw_at(what_, kpath,
                 fmt::format("unknown key '{}'; expected manifest_digest, layer_digest, "
                             "layer_size",
                             k));
      }
    }
    const char* names[3] = {"manifest_digest", "layer_digest", "layer_size"};
    for (int i = 0; i < 3; ++i)
      if (!has[i]) throw_at(what_, json_path_key(path, names[i]), "missing");
    return t;
  }

  Digest digest(const json& v, const std::string& path) {
    if (!v.is_string() || !Digest::is_valid(v.get<std::string>()))
      throw_at(what_, path, "expected \"sha256:<64 lowercase hex>\", got " + json_describe(v));
    return Digest::parse(v.get<std::string>());
  }

  std::string_view what_;
};

}  // namespace

LockFile LockFile::parse(std::string_view json_text, std::string_view what) {
  return Parser(what).document(parse_json_document(json_text, what, kMaxLockBytes));
}

LockFile LockFile::load(const std::filesystem::path& path) {
  return parse(fs::read_input_file(path, kMaxLockBytes, "a lock file from `kernel-hub lock`"),
               path.string());
}

std::string LockFile::serialize() const {
  std::vector<const LockEntry*> sorted;
  for (auto& e : entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const LockEntry* a, const LockEntry* b) {
    return std::make_pair(a->ref.str(), a->hub) < std::make_pair(b->ref.str(), b->hub);
  });
  json j;
  j["version"] = kVersion;
  j["entries"] = json::array();
  for (const LockEntry* e : sorted) {
    json ej;
    ej["ref"] = e->ref.str();
    ej["hub"] = e->hub;
    ej["index_digest"] = e->index_digest.str();
    ej["targets"] = json::object();
    for (auto& [dev, t] : e->targets)
      ej["targets"][dev] = {{"manifest_digest", t.manifest_digest.str()},
                            {"layer_digest", t.layer_digest.str()},
                            {"layer_size", t.layer_size}};
    j["entries"].push_back(std::move(ej));
  }
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

void LockFile::save(const std::filesystem::path& path) const {
  fs::write_file_atomic(path, serialize());
}

const LockEntry* LockFile::find(const Ref& ref) const {
  std::string s = ref.str();
  for (auto& e : entries)
    if (e.ref.str() == s) return &e;
  return nullptr;
}

void LockFile::put(LockEntry entry) {
  std::string s = entry.ref.str();
  for (auto& e : entries) {
    if (e.ref.str() == s) {
      e = std::move(entry);
      return;
    }
  }
  entries.push_back(std::move(entry));
}

const LockEntry& require_locked(const LockFile& lock, const Ref& ref) {
  const LockEntry* e = lock.find(ref);
  if (!e)
    throw Error(ErrorKind::kNotFound,
                fmt::format("lock: {} is not in the lock file; re-run kernel-hub lock for this "
                            "config",
                            ref.str()));
  return *e;
}

void check_locked_index(const LockEntry& entry, std::string_view hub, const Digest& found) {
  if (!hub.empty() && entry.hub != hub)
    throw Error(ErrorKind::kIntegrity,
                fmt::format("lock: {}: locked on hub {}, but resolving on hub {}; use that hub "
                            "or re-run kernel-hub lock",
                            entry.ref.str(), entry.hub, hub));
  check_locked_digest(entry, "index", entry.index_digest, found);
}

const LockTarget& require_locked_target(const LockEntry& entry, const std::string& device) {
  auto it = entry.targets.find(device);
  if (it == entry.targets.end()) {
    std::string have;
    for (auto& [d, t] : entry.targets) have += (have.empty() ? "" : ", ") + d;
    throw Error(ErrorKind::kNotFound,
                fmt::format("lock: {}: no target for device {} (locked: {}); re-run kernel-hub "
                            "lock --device for it",
                            entry.ref.str(), device, have.empty() ? "none" : have));
  }
  return it->second;
}

void check_locked_digest(const LockEntry& entry, std::string_view what, const Digest& expected,
                         const Digest& found) {
  if (expected != found)
    throw Error(ErrorKind::kIntegrity,
                fmt::format("lock: {}: {} digest mismatch: expected {} (locked), found {}; the "
                            "hub now serves other bytes (re-run kernel-hub lock to accept them)",
                            entry.ref.str(), what, expected.str(), found.str()));
}

}  // namespace kh
