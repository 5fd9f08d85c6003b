#include "hub/transport/http_headers.h"

#include <cctype>
#include <charconv>

namespace kh::http {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

void add_header_line(std::map<std::string, std::string>& headers, std::string_view line) {
  if (line.starts_with("HTTP/")) {
    headers.clear();
    return;
  }
  auto colon = line.find(':');
  if (colon == std::string_view::npos) return;
  std::string name = lower(trim(line.substr(0, colon)));
  std::string value = trim(line.substr(colon + 1));
  auto [it, inserted] = headers.emplace(name, value);
  // An empty element of a list adds nothing (RFC 9110 5.6.1: recipients ignore it); the fuzz
  // target found the ", " it used to leave at a value's end.
  if (!inserted && !value.empty()) it->second += (it->second.empty() ? "" : ", ") + value;
}

uint64_t content_range_start(const std::string& value) {
  std::string_view v = value;
  if (v.starts_with("bytes ")) v.remove_prefix(6);
  uint64_t start = 0;
  // Digits only: no sign, no white space, no wrap past 2^64 (strtoull would negate "-5").
  if (std::from_chars(v.data(), v.data() + v.size(), start).ec != std::errc()) return 0;
  return start;
}

Challenge parse_challenge(const std::string& header) {
  Challenge c;
  const std::string& h = header;
  const std::string lowered = lower(h);
  size_t pos = lowered.find("bearer ");
  if (pos == std::string::npos) pos = lowered.find("basic");
  if (pos == std::string::npos) pos = 0;
  size_t sp = h.find(' ', pos);
  c.scheme = lowered.substr(pos, sp == std::string::npos ? std::string::npos : sp - pos);
  if (sp == std::string::npos) return c;
  size_t i = sp + 1;
  while (i < h.size()) {
    while (i < h.size() && (h[i] == ' ' || h[i] == ',')) ++i;
    size_t eq = h.find('=', i);
    if (eq == std::string::npos) break;
    std::string key = lowered.substr(i, eq - i);
    // A new challenge ("Basic realm=...") after ours ends it.
    if (key.find(' ') != std::string::npos) break;
    i = eq + 1;
    std::string value;
    if (i < h.size() && h[i] == '"') {
      ++i;
      while (i < h.size() && h[i] != '"') {
        if (h[i] == '\\' && i + 1 < h.size()) ++i;
        value += h[i++];
      }
      ++i;
    } else {
      size_t end = h.find(',', i);
      value = h.substr(i, end == std::string::npos ? std::string::npos : end - i);
      i = end == std::string::npos ? h.size() : end;
    }
    c.params[key] = value;
  }
  return c;
}

}  // namespace kh::http
