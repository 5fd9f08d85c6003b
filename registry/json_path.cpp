#include "registry/json_path.h"

#include <fmt/format.h>

#include "hub/base/error.h"

namespace kh {

namespace {
bool is_identifier(std::string_view key) {
  if (key.empty()) return false;
  for (size_t i = 0; i < key.size(); ++i) {
    char c = key[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}
}  // namespace

std::string json_path_key(const std::string& parent, std::string_view key) {
  if (is_identifier(key)) return parent + "." + std::string(key);
  return parent + "[" + json_short(nlohmann::json(std::string(key))) + "]";
}

std::string json_path_index(const std::string& parent, size_t index) {
  return parent + "[" + std::to_string(index) + "]";
}

void throw_at(std::string_view what, const std::string& path, const std::string& problem) {
  throw Error(ErrorKind::kInvalidInput, fmt::format("{}: {}: {}", what, path, problem));
}

std::string json_short(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string json_describe(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::string:
      return "the string " + json_short(j);
    case nlohmann::json::value_t::boolean:
      return "the boolean " + json_short(j);
    default:
      return "the number " + json_short(j);
  }
}

nlohmann::json parse_json_document(std::string_view bytes, std::string_view what,
                                   uint64_t max_bytes) {
  if (bytes.size() > max_bytes)
    throw Error(ErrorKind::kInvalidInput, fmt::format("{}: {} bytes is over the limit of {} bytes",
                                                      what, bytes.size(), max_bytes));
  try {
    return nlohmann::json::parse(bytes);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}: not valid JSON at byte {}: {}", what, e.byte, e.what()));
  } catch (const nlohmann::json::exception& e) {
    // Not only parse_error: a number too large for a double throws out_of_range (406).
    throw Error(ErrorKind::kInvalidInput, fmt::format("{}: not valid JSON: {}", what, e.what()));
  }
}

}  // namespace kh
