#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <iostream>

#include "hub/base/error.h"
#include "hub/base/log.h"
#include "tools/kernel-hub/cli.h"

namespace kh::cli {

Store& Context::store() {
  if (!store_) {
    std::filesystem::path root =
        options_.cache.empty() ? Store::default_root() : std::filesystem::path(options_.cache);
    store_ = std::make_unique<Store>(root);
  }
  return *store_;
}

HubOptions Context::hub_options() const {
  HubOptions o = HubOptions::from_env();
  o.offline = o.offline || options_.offline;
  o.source.http.offline = o.offline;
  o.source.http.allow_plain_http = o.source.http.allow_plain_http || options_.plain_http;
  o.progress = !options_.quiet && !options_.json;
  o.trust.allow_unsigned = o.trust.allow_unsigned || options_.allow_unsigned;
  return o;
}

Hub& Context::hub() {
  if (!hub_) {
    HubOptions o = hub_options();
    HubAddress address = options_.hub.empty()
                             ? default_hub_address(store(), o.source.http.allow_plain_http)
                             : HubAddress::parse(options_.hub, o.source.http.allow_plain_http);
    hub_ = std::make_unique<Hub>(address, store(), o);
  }
  return *hub_;
}

void Context::say(const std::string& line) const {
  if (!options_.json) std::cout << line << "\n";
}

void Context::note(const std::string& line) const {
  if (!options_.quiet) std::cerr << line << "\n";
}

void Context::warn(const std::string& message) const {
  std::cerr << "warning: " << message << "\n";
}

void Context::note_or_warn(const std::string& line) const {
  constexpr std::string_view kPrefix = "warning: ";
  if (line.starts_with(kPrefix))
    warn(line.substr(kPrefix.size()));
  else
    note(line);
}

void Context::print_json(const nlohmann::json& j) const {
  std::cout << j.dump(2) << "\n";
}

void print_error(bool json, std::string_view kind, const std::string& message) {
  std::cerr << "error: " << terminal_safe(message) << "\n";
  if (json)
    std::cout << nlohmann::json{{"error", {{"kind", kind}, {"message", message}}}}.dump(2) << "\n";
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double b = static_cast<double>(bytes);
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", b, units[u]);
}

std::string iso_time(int64_t t) {
  if (t <= 0) return "-";
  std::time_t tt = static_cast<std::time_t>(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

namespace {
// The leading digits of `text` and the unit after them. Refuses an empty value (an empty
// --max-size must not read as "no limit") and a number that does not fit in 64 bits.
std::pair<uint64_t, std::string> split_number(const std::string& text, std::string_view option,
                                              const char* what) {
  size_t i = 0;
  while (i < text.size() && isdigit(static_cast<unsigned char>(text[i]))) ++i;
  uint64_t n = 0;
  bool fits = i > 0;
  for (size_t k = 0; k < i && fits; ++k) {
    unsigned digit = static_cast<unsigned>(text[k] - '0');
    fits = n <= (UINT64_MAX - digit) / 10;
    n = n * 10 + digit;
  }
  if (!fits)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{} '{}': not a {} (expected a number with an optional unit)", option,
                            text, what));
  return {n, text.substr(i)};
}

[[noreturn]] void too_large(std::string_view option, const std::string& text, const char* what) {
  throw Error(
      ErrorKind::kInvalidInput,
      fmt::format("{} '{}': the {} is too large (it does not fit in 64 bits)", option, text, what));
}
}  // namespace

uint64_t parse_size(const std::string& text, std::string_view option) {
  auto [n, unit] = split_number(text, option, "size");
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  if (unit == "K" || unit == "KiB") shift = 10;
  if (unit == "M" || unit == "MiB") shift = 20;
  if (unit == "G" || unit == "GiB") shift = 30;
  if (unit == "T" || unit == "TiB") shift = 40;
  if (shift < 0)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{} '{}': invalid size: use a number with an optional K, M, G or T",
                            option, text));
  // A shift past 64 bits would wrap to a tiny limit, and gc would remove everything.
  if (n > (UINT64_MAX >> shift)) too_large(option, text, "size");
  return n << shift;
}

int64_t parse_duration(const std::string& text, std::string_view option) {
  auto [n, unit] = split_number(text, option, "duration");
  int64_t factor = 0;
  if (unit == "s" || unit.empty()) factor = 1;
  if (unit == "m") factor = 60;
  if (unit == "h") factor = 3600;
  if (unit == "d") factor = 86400;
  if (factor == 0)
    throw Error(
        ErrorKind::kInvalidInput,
        fmt::format("{} '{}': invalid duration: use a number with s, m, h or d", option, text));
  // Signed overflow is undefined; a wrapped age could be negative and make every ref "old".
  if (n > static_cast<uint64_t>(INT64_MAX / factor)) too_large(option, text, "duration");
  return static_cast<int64_t>(n) * factor;
}

}  // namespace kh::cli
