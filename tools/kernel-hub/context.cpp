#include <fmt/format.h>

#include <cstdio>
#include <ctime>
#include <iostream>

#include "hub/base/error.h"
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

void Context::print_json(const nlohmann::json& j) const {
  std::cout << j.dump(2) << "\n";
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
std::pair<uint64_t, std::string> split_number(const std::string& text, const char* what) {
  size_t i = 0;
  while (i < text.size() && isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0 || i > 18) {
    throw Error(ErrorKind::kInvalidInput, fmt::format("invalid {} '{}'", what, text));
  }
  return {std::stoull(text.substr(0, i)), text.substr(i)};
}
}  // namespace

uint64_t parse_size(const std::string& text) {
  auto [n, unit] = split_number(text, "size");
  if (unit.empty() || unit == "B") return n;
  if (unit == "K" || unit == "KiB") return n << 10;
  if (unit == "M" || unit == "MiB") return n << 20;
  if (unit == "G" || unit == "GiB") return n << 30;
  if (unit == "T" || unit == "TiB") return n << 40;
  throw Error(ErrorKind::kInvalidInput,
              fmt::format("invalid size '{}': use a number with an optional K, M, G or T", text));
}

int64_t parse_duration(const std::string& text) {
  auto [n, unit] = split_number(text, "duration");
  int64_t v = static_cast<int64_t>(n);
  if (unit == "s" || unit.empty()) return v;
  if (unit == "m") return v * 60;
  if (unit == "h") return v * 3600;
  if (unit == "d") return v * 86400;
  throw Error(ErrorKind::kInvalidInput,
              fmt::format("invalid duration '{}': use a number with s, m, h or d", text));
}

}  // namespace kh::cli
