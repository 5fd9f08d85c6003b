#include "hub/transport/http_headers.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <vector>

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
  // Challenges and their parameters in order: a token followed by '=' is a parameter of the
  // challenge before it, any other token starts a challenge. Quoted values are read whole, so a
  // scheme's name inside one ("Basic realm=\"bearer\"") is a value, not a challenge.
  std::vector<Challenge> all;
  const std::string& h = header;
  size_t i = 0;
  while (i < h.size()) {
    while (i < h.size() && (h[i] == ' ' || h[i] == ',')) ++i;
    const size_t start = i;
    while (i < h.size() && h[i] != ' ' && h[i] != ',' && h[i] != '=') ++i;
    if (i == start) {  // a '=' with no name: skip its value
      ++i;
      continue;
    }
    const std::string token = lower(std::string_view(h).substr(start, i - start));
    if (i >= h.size() || h[i] != '=') {
      all.push_back({token, {}});
      continue;
    }
    ++i;  // past '='
    std::string value;
    if (i < h.size() && h[i] == '"') {
      ++i;
      while (i < h.size() && h[i] != '"') {
        if (h[i] == '\\' && i + 1 < h.size()) ++i;
        value += h[i++];
      }
      ++i;  // past the closing quote
    } else {
      const size_t end = std::min(h.find(',', i), h.size());
      value = trim(std::string_view(h).substr(i, end - i));
      i = end;
    }
    if (!all.empty()) all.back().params[token] = value;  // none before a scheme: ignored
  }
  for (const char* preferred : {"bearer", "basic"})
    for (const Challenge& c : all)
      if (c.scheme == preferred) return c;
  return all.empty() ? Challenge{} : all.front();
}

bool bearer_token_ok(std::string_view token) {
  if (token.empty()) return false;
  for (unsigned char c : token)
    if (c < 0x21 || c > 0x7E) return false;
  return true;
}

}  // namespace kh::http
