// Helpers shared by the registry's JSON parsers (KernelConfig, kernel.json, lock files): JSON
// paths for error messages ("$.RMSNorm.cuda[1].capability") and bounded document parsing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace kh {

// "$" extended by an object key: ".key" for identifiers, "[\"odd key\"]" otherwise.
std::string json_path_key(const std::string& parent, std::string_view key);
// "$" extended by an array index: "[3]".
std::string json_path_index(const std::string& parent, size_t index);

// Throws kh::Error(kInvalidInput) "<what>: <path>: <problem>".
[[noreturn]] void throw_at(std::string_view what, const std::string& path,
                           const std::string& problem);

// "string", "object", "number 1.5", ... for "expected X, got Y" messages.
std::string json_describe(const nlohmann::json& j);

// Parses a JSON document of at most max_bytes; kInvalidInput names `what` and the byte offset.
nlohmann::json parse_json_document(std::string_view bytes, std::string_view what,
                                   uint64_t max_bytes = 4 << 20);

// A JSON value as text for messages (invalid UTF-8 replaced, long values shortened).
std::string json_short(const nlohmann::json& j);

}  // namespace kh
