#include "hub/oci/oci.h"

#include <openssl/evp.h>

#include <cstdint>

#include <nlohmann/json.hpp>

#include "hub/base/error.h"

namespace kh::oci {

using json = nlohmann::json;

namespace {

[[noreturn]] void invalid(std::string_view what, const std::string& path, const std::string& msg) {
  throw Error(ErrorKind::kInvalidInput,
              std::string(what) + ": " + (path.empty() ? "" : path + ": ") + msg);
}

const json& require(const json& obj, const char* key, std::string_view what,
                    const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end()) invalid(what, path, std::string("missing field '") + key + "'");
  return *it;
}

std::string get_string(const json& obj, const char* key, std::string_view what,
                       const std::string& path, bool required) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) invalid(what, path, std::string("missing field '") + key + "'");
    return {};
  }
  if (!it->is_string()) invalid(what, path + (path.empty() ? "" : ".") + key, "expected a string");
  return it->get<std::string>();
}

std::string join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

bool valid_media_type(std::string_view mt) {
  // RFC 6838: type "/" subtype, restricted characters. Enough to refuse garbage.
  auto slash = mt.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 >= mt.size()) return false;
  for (char c : mt) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              std::string_view("!#$&-^_.+/").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

Annotations parse_annotations(const json& obj, std::string_view what, const std::string& path) {
  Annotations out;
  auto it = obj.find("annotations");
  if (it == obj.end() || it->is_null()) return out;
  if (!it->is_object()) invalid(what, join(path, "annotations"), "expected an object");
  for (auto& [k, v] : it->items()) {
    if (!v.is_string()) invalid(what, join(path, "annotations." + k), "expected a string");
    out[k] = v.get<std::string>();
  }
  return out;
}

Descriptor parse_descriptor(const json& j, std::string_view what, const std::string& path) {
  if (!j.is_object()) invalid(what, path, "expected an object");
  Descriptor d;
  d.media_type = get_string(j, "mediaType", what, path, true);
  if (!valid_media_type(d.media_type)) {
    invalid(what, join(path, "mediaType"), "invalid media type '" + d.media_type + "'");
  }
  std::string digest = get_string(j, "digest", what, path, true);
  if (!Digest::is_valid(digest)) {
    invalid(what, join(path, "digest"),
            "invalid digest '" + digest + "' (expected sha256:<64 lowercase hex>)");
  }
  d.digest = Digest::parse(digest);
  const json& size = require(j, "size", what, path);
  if (!size.is_number_integer() || size.get<int64_t>() < 0) {
    invalid(what, join(path, "size"), "expected a non-negative integer");
  }
  d.size = size.get<int64_t>();
  d.artifact_type = get_string(j, "artifactType", what, path, false);
  d.annotations = parse_annotations(j, what, path);
  if (auto it = j.find("urls"); it != j.end()) {
    if (!it->is_array()) invalid(what, join(path, "urls"), "expected an array");
    for (auto& u : *it) {
      if (!u.is_string()) invalid(what, join(path, "urls"), "expected strings");
      d.urls.push_back(u.get<std::string>());
    }
  }
  if (auto it = j.find("data"); it != j.end()) {
    if (!it->is_string()) invalid(what, join(path, "data"), "expected a base64 string");
    auto raw = base64_decode(it->get<std::string>());
    if (!raw) invalid(what, join(path, "data"), "not valid base64");
    if (static_cast<int64_t>(raw->size()) != d.size || sha256_of(*raw) != d.digest) {
      invalid(what, join(path, "data"), "inline data does not match the descriptor's size/digest");
    }
    d.data = it->get<std::string>();
  }
  if (auto it = j.find("platform"); it != j.end()) {
    if (!it->is_object()) invalid(what, join(path, "platform"), "expected an object");
    Platform p;
    p.os = get_string(*it, "os", what, join(path, "platform"), true);
    p.architecture = get_string(*it, "architecture", what, join(path, "platform"), true);
    p.variant = get_string(*it, "variant", what, join(path, "platform"), false);
    d.platform = p;
  }
  return d;
}

json parse_json_object(std::string_view bytes, std::string_view what) {
  json j;
  try {
    j = json::parse(bytes.begin(), bytes.end());
  } catch (const json::exception& e) {
    invalid(what, "", std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) invalid(what, "", "expected a JSON object");
  return j;
}

void check_schema_version(const json& j, std::string_view what) {
  const json& sv = require(j, "schemaVersion", what, "");
  if (!sv.is_number_integer() || sv.get<int64_t>() != 2) {
    invalid(what, "schemaVersion", "expected 2");
  }
}

std::optional<Descriptor> parse_subject(const json& j, std::string_view what) {
  auto it = j.find("subject");
  if (it == j.end() || it->is_null()) return std::nullopt;
  return parse_descriptor(*it, what, "subject");
}

json to_json(const Descriptor& d) {
  json j;
  j["mediaType"] = d.media_type;
  j["digest"] = d.digest.str();
  j["size"] = d.size;
  if (!d.artifact_type.empty()) j["artifactType"] = d.artifact_type;
  if (!d.annotations.empty()) j["annotations"] = d.annotations;
  if (!d.urls.empty()) j["urls"] = d.urls;
  if (d.data) j["data"] = *d.data;
  if (d.platform) {
    json p;
    p["os"] = d.platform->os;
    p["architecture"] = d.platform->architecture;
    if (!d.platform->variant.empty()) p["variant"] = d.platform->variant;
    j["platform"] = p;
  }
  return j;
}

}  // namespace

Descriptor empty_descriptor() {
  Descriptor d = describe("{}", kMediaTypeEmpty);
  d.data = base64_encode("{}");
  return d;
}

Descriptor describe(std::string_view bytes, std::string_view media_type) {
  Descriptor d;
  d.media_type = std::string(media_type);
  d.digest = sha256_of(bytes);
  d.size = static_cast<int64_t>(bytes.size());
  return d;
}

Manifest parse_manifest(std::string_view bytes, std::string_view what) {
  json j = parse_json_object(bytes, what);
  check_schema_version(j, what);
  Manifest m;
  m.media_type = get_string(j, "mediaType", what, "", false);
  if (!m.media_type.empty() && m.media_type != kMediaTypeManifest) {
    invalid(what, "mediaType",
            "expected '" + std::string(kMediaTypeManifest) + "', got '" + m.media_type + "'");
  }
  if (m.media_type.empty()) m.media_type = kMediaTypeManifest;
  m.artifact_type = get_string(j, "artifactType", what, "", false);
  m.config = parse_descriptor(require(j, "config", what, ""), what, "config");
  const json& layers = require(j, "layers", what, "");
  if (!layers.is_array()) invalid(what, "layers", "expected an array");
  for (size_t i = 0; i < layers.size(); ++i) {
    m.layers.push_back(parse_descriptor(layers[i], what, "layers[" + std::to_string(i) + "]"));
  }
  m.subject = parse_subject(j, what);
  m.annotations = parse_annotations(j, what, "");
  return m;
}

Index parse_index(std::string_view bytes, std::string_view what) {
  json j = parse_json_object(bytes, what);
  check_schema_version(j, what);
  Index x;
  x.media_type = get_string(j, "mediaType", what, "", false);
  if (!x.media_type.empty() && x.media_type != kMediaTypeIndex) {
    invalid(what, "mediaType",
            "expected '" + std::string(kMediaTypeIndex) + "', got '" + x.media_type + "'");
  }
  if (x.media_type.empty()) x.media_type = kMediaTypeIndex;
  x.artifact_type = get_string(j, "artifactType", what, "", false);
  const json& manifests = require(j, "manifests", what, "");
  if (!manifests.is_array()) invalid(what, "manifests", "expected an array");
  for (size_t i = 0; i < manifests.size(); ++i) {
    x.manifests.push_back(
        parse_descriptor(manifests[i], what, "manifests[" + std::to_string(i) + "]"));
  }
  x.subject = parse_subject(j, what);
  x.annotations = parse_annotations(j, what, "");
  return x;
}

Descriptor parse_descriptor_json(std::string_view bytes, std::string_view what) {
  return parse_descriptor(parse_json_object(bytes, what), what, "");
}

std::string peek_media_type(std::string_view bytes) {
  json j = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return {};
  auto it = j.find("mediaType");
  if (it == j.end() || !it->is_string()) return {};
  return it->get<std::string>();
}

void verify_bytes(const Descriptor& d, std::string_view bytes, std::string_view what) {
  if (static_cast<int64_t>(bytes.size()) != d.size) {
    throw Error(ErrorKind::kIntegrity, std::string(what) + ": size " +
                                           std::to_string(bytes.size()) + " does not match " +
                                           std::to_string(d.size) + " of " + d.digest.str());
  }
  Digest got = sha256_of(bytes);
  if (got != d.digest) {
    throw Error(ErrorKind::kIntegrity, std::string(what) + ": digest mismatch: expected " +
                                           d.digest.str() + ", got " + got.str());
  }
}

std::string serialize(const Manifest& m) {
  json j;
  j["schemaVersion"] = 2;
  j["mediaType"] = m.media_type;
  if (!m.artifact_type.empty()) j["artifactType"] = m.artifact_type;
  j["config"] = to_json(m.config);
  j["layers"] = json::array();
  for (auto& l : m.layers) j["layers"].push_back(to_json(l));
  if (m.subject) j["subject"] = to_json(*m.subject);
  if (!m.annotations.empty()) j["annotations"] = m.annotations;
  return j.dump();
}

std::string serialize(const Index& x) {
  json j;
  j["schemaVersion"] = 2;
  j["mediaType"] = x.media_type;
  if (!x.artifact_type.empty()) j["artifactType"] = x.artifact_type;
  j["manifests"] = json::array();
  for (auto& d : x.manifests) j["manifests"].push_back(to_json(d));
  if (x.subject) j["subject"] = to_json(*x.subject);
  if (!x.annotations.empty()) j["annotations"] = x.annotations;
  return j.dump();
}

std::string serialize(const Descriptor& d) {
  return to_json(d).dump();
}

}  // namespace kh::oci
