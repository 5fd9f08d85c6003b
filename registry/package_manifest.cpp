#include "registry/package_manifest.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "loader/verified_file.h"
#include "registry/device.h"
#include "registry/json_path.h"
#include "registry/kernel_config.h"

namespace kh {

using nlohmann::json;

namespace {

const std::set<std::string, std::less<>> kFlags = {"backward", "graph_safe", "deterministic"};
const std::set<std::string, std::less<>> kDtypes = {"bf16", "fp16", "fp32"};
const std::set<std::string, std::less<>> kOps = {"forward", "forward_train", "backward"};

// A relative path inside the package: '/'-separated, no empty, "." or ".." parts, no NUL or
// backslash, not absolute.
bool is_safe_relative_path(std::string_view p) {
  if (p.empty() || p.size() > 1024 || p.front() == '/') return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string_view::npos) end = p.size();
    std::string_view part = p.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    for (char c : part)
      if (c == '\0' || c == '\\' || static_cast<unsigned char>(c) < 0x20) return false;
    start = end + 1;
  }
  return true;
}

bool is_sm_key(std::string_view s) {
  if (s.empty() || s.size() > 5) return false;
  std::string_view digits = s;
  if (digits.back() == 'a' || digits.back() == 'f') digits.remove_suffix(1);
  if (digits.size() < 2) return false;
  for (char c : digits)
    if (c < '0' || c > '9') return false;
  return digits.front() != '0';
}

class Parser {
 public:
  explicit Parser(std::string_view what) : what_(what) {}

  PackageManifest document(const json& j) {
    if (!j.is_object())
      throw_at(what_, "$",
               "expected a JSON object (the package manifest), got " + json_describe(j));
    PackageManifest m;
    m.name = required_string(j, "$", "name");
    m.version = required_string(j, "$", "version");
    m.host_library = required_string(j, "$", "host_library");
    if (!is_safe_relative_path(m.host_library) || m.host_library.find('/') != std::string::npos)
      throw_at(
          what_, "$.host_library",
          fmt::format("'{}' must be a file name inside the package directory", m.host_library));
    abi(j, m);
    m.device = required_string(j, "$", "device");
    if (m.device != "cuda" && m.device != "cpu")
      throw_at(what_, "$.device",
               fmt::format("unknown device '{}'; expected one of: cuda, cpu", m.device));
    files(j, m);
    device_code(j, m);
    cuda(j, m);
    layers(j, m);
    // Every file the manifest names must be covered by "files".
    auto listed = [&](const std::string& file, const std::string& path) {
      if (!m.files.count(file))
        throw_at(what_, path,
                 fmt::format("'{}' is not listed in \"files\"; expected every packaged file "
                             "with its sha256",
                             file));
    };
    listed(m.host_library, "$.host_library");
    if (m.has_source()) listed(m.cuda_source, "$.cuda_source");
    for (auto& [sm, file] : m.cubins) listed(file, json_path_key("$.cubins", sm));
    return m;
  }

 private:
  std::string required_string(const json& j, const std::string& path, const char* key) {
    std::string kpath = json_path_key(path, key);
    auto it = j.find(key);
    if (it == j.end()) throw_at(what_, kpath, "missing; expected a non-empty string");
    if (!it->is_string() || it->get<std::string>().empty() || it->get<std::string>().size() > 1024)
      throw_at(what_, kpath, "expected a non-empty string, got " + json_describe(*it));
    return it->get<std::string>();
  }

  const json& required(const json& j, const std::string& path, const char* key, json::value_t type,
                       const char* expected) {
    std::string kpath = json_path_key(path, key);
    auto it = j.find(key);
    if (it == j.end()) throw_at(what_, kpath, std::string("missing; expected ") + expected);
    if (it->type() != type)
      throw_at(what_, kpath, std::string("expected ") + expected + ", got " + json_describe(*it));
    return *it;
  }

  int small_int(const json& j, const std::string& path, int lo) {
    if (!j.is_number_integer() || j.get<int64_t>() < lo || j.get<int64_t>() > 65535)
      throw_at(what_, path,
               fmt::format("expected an integer {}..65535, got {}", lo, json_describe(j)));
    return static_cast<int>(j.get<int64_t>());
  }

  void abi(const json& j, PackageManifest& m) {
    const json& a = required(j, "$", "abi", json::value_t::object, "{\"major\": 1, \"minor\": 0}");
    for (auto& [k, v] : a.items()) {
      std::string kpath = json_path_key("$.abi", k);
      if (k == "major")
        m.abi_major = small_int(v, kpath, 1);
      else if (k == "minor")
        m.abi_minor = small_int(v, kpath, 0);
      else
        throw_at(what_, kpath, fmt::format("unknown key '{}'; expected major, minor", k));
    }
    if (!a.contains("major")) throw_at(what_, "$.abi.major", "missing; expected an integer >= 1");
  }

  void files(const json& j, PackageManifest& m) {
    const json& f = required(j, "$", "files", json::value_t::object,
                             "{\"path\": \"sha256:<hex>\"} for every file of the package");
    for (auto& [path, v] : f.items()) {
      std::string kpath = json_path_key("$.files", path);
      if (!is_safe_relative_path(path))
        throw_at(what_, kpath, "expected a relative path inside the package (no '..', no '/')");
      if (path == kPackageManifestName)
        throw_at(what_, kpath, "kernel.json cannot list its own digest; leave it out");
      if (!v.is_string() || !Digest::is_valid(v.get<std::string>()))
        throw_at(what_, kpath, "expected \"sha256:<64 lowercase hex>\", got " + json_describe(v));
      m.files[path] = Digest::parse(v.get<std::string>());
    }
  }

  // A plain file name inside the package (what the loader accepts for device code).
  bool is_plain_file_name(const std::string& f) {
    return is_safe_relative_path(f) && f.find('/') == std::string::npos;
  }

  void device_code(const json& j, PackageManifest& m) {
    if (auto it = j.find("cuda_source"); it != j.end()) {
      if (!it->is_string() || !is_plain_file_name(it->get<std::string>()))
        throw_at(what_, "$.cuda_source",
                 "expected the file name of the .cu source, got " + json_describe(*it));
      m.cuda_source = it->get<std::string>();
    }
    if (auto it = j.find("cubins"); it != j.end()) {
      if (!it->is_object())
        throw_at(what_, "$.cubins",
                 "expected {\"<sm>\": \"<file>\"}, e.g. {\"90a\": \"k.sm_90a.cubin\"}, got " +
                     json_describe(*it));
      for (auto& [sm, file] : it->items()) {
        std::string spath = json_path_key("$.cubins", sm);
        if (!is_sm_key(sm))
          throw_at(what_, spath,
                   fmt::format("'{}' is not an sm; expected digits with an optional a/f suffix, "
                               "e.g. 90 or 90a",
                               sm));
        if (!file.is_string() || !is_plain_file_name(file.get<std::string>()))
          throw_at(what_, spath, "expected a file name in the package, got " + json_describe(file));
        m.cubins[sm] = file.get<std::string>();
      }
    }
  }

  void cuda(const json& j, PackageManifest& m) {
    auto it = j.find("cuda");
    if (m.device != "cuda") {
      const char* extra = it != j.end()       ? "$.cuda"
                          : m.has_source()    ? "$.cuda_source"
                          : !m.cubins.empty() ? "$.cubins"
                                              : nullptr;
      if (extra) throw_at(what_, extra, "applies to device cuda only; this package is " + m.device);
      return;
    }
    const json& c = required(j, "$", "cuda", json::value_t::object, "{\"version\": \"12.4\"}");
    for (auto& [k, v] : c.items()) {
      std::string kpath = json_path_key("$.cuda", k);
      if (k != "version")
        throw_at(what_, kpath, fmt::format("unknown key '{}'; expected version", k));
      if (!v.is_string() || !parse_cuda_version(v.get<std::string>()))
        throw_at(what_, kpath, "expected a CUDA version like \"12.4\", got " + json_describe(v));
      m.cuda_version = v.get<std::string>();
    }
    if (m.cuda_version.empty())
      throw_at(what_, "$.cuda.version", "missing; expected the CUDA version the code needs");
    if (m.cubins.empty() && !m.has_source())
      throw_at(what_, "$",
               "a cuda package needs device code: \"cubins\" or \"cuda_source\" (or both)");
  }

  void layers(const json& j, PackageManifest& m) {
    const json& ls = required(j, "$", "layers", json::value_t::object,
                              "{\"LayerName\": {\"ops\", \"flags\", \"dtypes\"}}");
    m.layers = layer_map(ls, "$.layers");
  }

 public:
  // kernel.json's "layers" object (at `path`), also the kernelhub.layers annotation's value.
  std::map<std::string, PackageLayer> layer_map(const json& ls, const std::string& path) {
    if (!ls.is_object())
      throw_at(
          what_, path,
          "expected {\"LayerName\": {\"ops\", \"flags\", \"dtypes\"}}, got " + json_describe(ls));
    if (ls.empty()) throw_at(what_, path, "empty; expected at least one layer");
    std::map<std::string, PackageLayer> out;
    for (auto& [name, v] : ls.items()) {
      std::string lpath = json_path_key(path, name);
      if (!is_valid_layer_name(name))
        throw_at(what_, lpath, "not a valid layer name; expected [A-Za-z_][A-Za-z0-9_.-]*");
      if (!v.is_object())
        throw_at(what_, lpath,
                 "expected {\"ops\", \"flags\", \"dtypes\"}, got " + json_describe(v));
      PackageLayer layer;
      for (auto& [k, lv] : v.items()) {
        std::string kpath = json_path_key(lpath, k);
        if (k == "ops") {
          if (!lv.is_object())
            throw_at(what_, kpath, "expected {\"forward\": op, ...}, got " + json_describe(lv));
          for (auto& [op, name_json] : lv.items()) {
            std::string opath = json_path_key(kpath, op);
            if (!kOps.count(op))
              throw_at(
                  what_, opath,
                  fmt::format("unknown op '{}'; expected forward, forward_train, backward", op));
            if (!name_json.is_string() || name_json.get<std::string>().empty())
              throw_at(what_, opath, "expected an op name, got " + json_describe(name_json));
            std::string n = name_json.get<std::string>();
            (op == "forward"         ? layer.forward
             : op == "forward_train" ? layer.forward_train
                                     : layer.backward) = n;
          }
        } else if (k == "flags") {
          for (auto& f : string_list(lv, kpath, kFlags, "backward, graph_safe, deterministic")) {
            if (f == "backward") layer.has_backward = true;
            if (f == "graph_safe") layer.graph_safe = true;
            if (f == "deterministic") layer.deterministic = true;
          }
        } else if (k == "dtypes") {
          layer.dtypes = string_list(lv, kpath, kDtypes, "bf16, fp16, fp32");
          if (layer.dtypes.empty()) throw_at(what_, kpath, "empty; expected at least one dtype");
        } else {
          throw_at(what_, kpath, fmt::format("unknown key '{}'; expected ops, flags, dtypes", k));
        }
      }
      if (layer.forward.empty())
        throw_at(what_, json_path_key(json_path_key(lpath, "ops"), "forward"),
                 "missing; every layer needs a forward op");
      if (layer.dtypes.empty())
        throw_at(what_, json_path_key(lpath, "dtypes"), "missing; expected e.g. [\"fp32\"]");
      if (layer.has_backward != !layer.backward.empty())
        throw_at(what_, lpath,
                 layer.has_backward ? "flag \"backward\" needs ops.backward"
                                    : "ops.backward needs the flag \"backward\"");
      out[name] = std::move(layer);
    }
    return out;
  }

 private:
  std::vector<std::string> string_list(const json& j, const std::string& path,
                                       const std::set<std::string, std::less<>>& allowed,
                                       const char* expected) {
    if (!j.is_array())
      throw_at(what_, path,
               std::string("expected a list of ") + expected + ", got " + json_describe(j));
    std::vector<std::string> out;
    for (size_t i = 0; i < j.size(); ++i) {
      if (!j[i].is_string() || !allowed.count(j[i].get<std::string>()))
        throw_at(what_, json_path_index(path, i),
                 std::string("expected one of ") + expected + ", got " + json_describe(j[i]));
      std::string s = j[i].get<std::string>();
      if (std::find(out.begin(), out.end(), s) != out.end())
        throw_at(what_, json_path_index(path, i), "listed twice");
      out.push_back(std::move(s));
    }
    return out;
  }

  std::string_view what_;
};

}  // namespace

std::vector<std::string> PackageManifest::sm_list() const {
  std::vector<std::string> out;
  for (auto& [sm, file] : cubins) out.push_back(sm);
  return out;
}

PackageManifest PackageManifest::parse(std::string_view json_text, std::string_view what) {
  return Parser(what).document(parse_json_document(json_text, what, kMaxPackageManifestBytes));
}

namespace {

json layers_json(const std::map<std::string, PackageLayer>& layers) {
  json out = json::object();
  for (auto& [n, l] : layers) {
    json lj;
    lj["ops"]["forward"] = l.forward;
    if (!l.forward_train.empty()) lj["ops"]["forward_train"] = l.forward_train;
    if (!l.backward.empty()) lj["ops"]["backward"] = l.backward;
    lj["flags"] = json::array();
    if (l.has_backward) lj["flags"].push_back("backward");
    if (l.graph_safe) lj["flags"].push_back("graph_safe");
    if (l.deterministic) lj["flags"].push_back("deterministic");
    lj["dtypes"] = l.dtypes;
    out[n] = std::move(lj);
  }
  return out;
}

}  // namespace

std::string serialize_package_layers(const std::map<std::string, PackageLayer>& layers) {
  return layers_json(layers).dump();
}

std::map<std::string, PackageLayer> parse_package_layers(std::string_view json_text,
                                                         std::string_view what) {
  return Parser(what).layer_map(parse_json_document(json_text, what, kMaxLayersAnnotationBytes),
                                "$");
}

std::string PackageManifest::serialize() const {
  json j;
  j["name"] = name;
  j["version"] = version;
  j["abi"] = {{"major", abi_major}, {"minor", abi_minor}};
  j["device"] = device;
  j["host_library"] = host_library;
  if (device == "cuda") j["cuda"]["version"] = cuda_version;
  if (!cubins.empty()) {
    j["cubins"] = json::object();
    for (auto& [sm, file] : cubins) j["cubins"][sm] = file;
  }
  if (has_source()) j["cuda_source"] = cuda_source;
  j["layers"] = layers_json(layers);
  j["files"] = json::object();
  for (auto& [p, d] : files) j["files"][p] = d.str();
  return j.dump(2) + "\n";
}

PackageManifest read_package_manifest(const std::filesystem::path& dir) {
  std::filesystem::path file = dir / kPackageManifestName;
  return PackageManifest::parse(fs::read_file(file, kMaxPackageManifestBytes), file.string());
}

namespace {

// Walks dir; calls on_file(relative path, absolute path) for regular files; throws kRefused on
// anything else that is not a directory.
template <typename F>
void walk_package(const std::filesystem::path& dir, F on_file) {
  namespace stdfs = std::filesystem;
  std::error_code ec;
  stdfs::recursive_directory_iterator it(dir, ec), end;
  if (ec)
    throw Error(
        ec == std::errc::no_such_file_or_directory ? ErrorKind::kNotFound : ErrorKind::kIo,
        fmt::format("{}: cannot list the package directory: {}", dir.string(), ec.message()));
  for (; it != end; it.increment(ec)) {
    if (ec)
      throw Error(ErrorKind::kIo, fmt::format("{}: cannot list the package directory: {}",
                                              dir.string(), ec.message()));
    stdfs::file_status st = it->symlink_status(ec);
    std::string rel = it->path().lexically_relative(dir).generic_string();
    if (st.type() == stdfs::file_type::directory) continue;
    if (st.type() != stdfs::file_type::regular)
      throw Error(ErrorKind::kRefused,
                  fmt::format("{}: '{}' is not a regular file (symlink or special file); a "
                              "package holds regular files only",
                              dir.string(), rel));
    on_file(rel, it->path());
  }
}

}  // namespace

std::map<std::string, Digest> hash_package_files(const std::filesystem::path& dir) {
  std::map<std::string, Digest> out;
  walk_package(dir, [&](const std::string& rel, const std::filesystem::path& abs) {
    if (rel != kPackageManifestName) out[rel] = sha256_of_file(abs);
  });
  return out;
}

void verify_package_files(const std::filesystem::path& dir, const PackageManifest& manifest) {
  std::vector<std::string> problems;
  std::set<std::string> seen;
  try {
    walk_package(dir, [&](const std::string& rel, const std::filesystem::path& abs) {
      if (rel == kPackageManifestName) return;
      auto it = manifest.files.find(rel);
      if (it == manifest.files.end()) {
        problems.push_back(fmt::format("'{}' is not listed in kernel.json \"files\"", rel));
        return;
      }
      seen.insert(rel);
      Digest found = open_verified(abs).digest;  // no link followed; remembered per inode
      if (found != it->second)
        problems.push_back(fmt::format("'{}' has digest {}, kernel.json expects {}", rel,
                                       found.str(), it->second.str()));
    });
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kRefused) throw;
    throw Error(ErrorKind::kIntegrity, std::string(e.what()) + "; package refused");
  }
  for (auto& [path, digest] : manifest.files)
    if (!seen.count(path))
      problems.push_back(fmt::format("'{}' is listed in kernel.json (expects {}) but missing", path,
                                     digest.str()));
  if (problems.empty()) return;
  std::string msg =
      fmt::format("{}: package {} {} refused: ", dir.string(), manifest.name, manifest.version);
  for (size_t i = 0; i < problems.size() && i < 10; ++i) msg += (i ? "; " : "") + problems[i];
  if (problems.size() > 10) msg += fmt::format("; and {} more", problems.size() - 10);
  msg += " (re-fetch the package, or repack it with kernel-hub pack)";
  throw Error(ErrorKind::kIntegrity, msg);
}

}  // namespace kh
