#include "registry/device.h"

#include <fmt/format.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cctype>
#include <vector>

#include "hub/base/error.h"
#include "loader/cuda_driver.h"

namespace kh {

namespace {

std::optional<int> parse_small_int(std::string_view s) {
  if (s.empty() || s.size() > 4) return std::nullopt;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool is_platform_word(std::string_view s) {
  if (s.empty() || s.size() > 32) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

}  // namespace

std::optional<int> parse_sm(std::string_view text) {
  std::string_view s = text;
  if (s.starts_with("sm_")) s.remove_prefix(3);
  if (s.ends_with("a") || s.ends_with("f")) s.remove_suffix(1);
  if (auto dot = s.find('.'); dot != std::string_view::npos) {
    auto major = parse_small_int(s.substr(0, dot));
    auto minor = parse_small_int(s.substr(dot + 1));
    if (!major || !minor || *minor > 9 || *major == 0) return std::nullopt;
    return *major * 10 + *minor;
  }
  auto v = parse_small_int(s);
  if (!v || *v < 10) return std::nullopt;
  return v;
}

std::optional<std::pair<int, int>> parse_cuda_version(std::string_view text) {
  auto dot = text.find('.');
  auto major = parse_small_int(text.substr(0, dot));
  if (!major || *major == 0) return std::nullopt;
  if (dot == std::string_view::npos) return std::make_pair(*major, 0);
  auto minor = parse_small_int(text.substr(dot + 1));
  if (!minor) return std::nullopt;
  return std::make_pair(*major, *minor);
}

std::string Device::str() const {
  if (is_cuda())
    return fmt::format("cuda:sm_{}:cuda_{}.{}:{}/{}", sm, cuda_major, cuda_minor, os, arch);
  return fmt::format("{}:{}/{}", key, os, arch);
}

std::string Device::describe() const {
  if (is_cuda())
    return fmt::format("cuda sm_{}, driver CUDA {}.{}, {}/{}", sm, cuda_major, cuda_minor, os,
                       arch);
  return fmt::format("{} {}/{}", key, os, arch);
}

Device make_device(const DeviceFields& f) {
  auto fail = [](const std::string& why) {
    throw Error(ErrorKind::kInvalidInput, "device: " + why);
  };
  // "cuda:N" (or "cuda" with neither --sm nor --cuda): GPU N of this machine, read from the
  // driver. Given by hand, a cuda device needs no GPU (a build host resolving for a fleet).
  std::optional<int> ordinal;
  std::string key = f.key;
  if (key.starts_with("cuda:")) {
    const std::string n = key.substr(5);
    if (n.empty() || n.size() > 3 || !std::all_of(n.begin(), n.end(), ::isdigit)) {
      fail(fmt::format("'{}' is not a device; expected cpu, cuda or cuda:N (a GPU ordinal)", key));
    }
    ordinal = std::stoi(n);
    key = "cuda";
  } else if (key == "cuda" && !f.sm && !f.cuda) {
    ordinal = 0;
  }
  if (ordinal) {
    if (f.sm || f.cuda) fail("give either cuda:N (read from the driver) or --sm and --cuda");
    try {
      const cuda::DeviceInfo& info = cuda::device(*ordinal);
      const int version = cuda::cuda_driver().driver_version;
      DeviceFields local = f;
      local.key = "cuda";
      local.sm = std::to_string(info.sm_major * 10 + info.sm_minor);
      local.cuda = fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
      return make_device(local);
    } catch (const Error& e) {
      fail(
          fmt::format("cannot read GPU {} from the driver: {}; to describe a GPU by hand give "
                      "--device cuda --sm NN --cuda X.Y",
                      *ordinal, e.what()));
    }
  }
  Device d;
  d.key = key;
  if (d.key != "cuda" && d.key != "cpu")
    fail(fmt::format("unknown device '{}'; expected cuda or cpu", f.key));
  d.os = f.os ? lower(*f.os) : local_os();
  d.arch = f.arch ? lower(*f.arch) : local_arch();
  if (!is_platform_word(d.os)) fail(fmt::format("os '{}' is not an OCI os name (linux)", d.os));
  if (!is_platform_word(d.arch))
    fail(fmt::format("arch '{}' is not an OCI architecture (amd64, arm64)", d.arch));
  if (d.is_cuda()) {
    if (!f.sm) fail("cuda needs --sm (compute capability, e.g. 90 for H100/H200)");
    if (!f.cuda) fail("cuda needs --cuda (the driver's CUDA version, e.g. 13.0)");
    auto sm = parse_sm(*f.sm);
    if (!sm)
      fail(
          fmt::format("--sm '{}' is not a compute capability; expected e.g. 90, 9.0, "
                      "sm_90 or 90a",
                      *f.sm));
    auto cv = parse_cuda_version(*f.cuda);
    if (!cv) fail(fmt::format("--cuda '{}' is not a CUDA version; expected e.g. 13.0", *f.cuda));
    d.sm = *sm;
    d.cuda_major = cv->first;
    d.cuda_minor = cv->second;
  } else if (f.sm || f.cuda) {
    fail("--sm and --cuda apply to --device cuda only");
  }
  return d;
}

Device parse_device_spec(std::string_view text) {
  auto fail = [&]() -> Device {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("device '{}': expected cuda:sm_90:cuda_13.0:linux/amd64 or "
                            "cpu:linux/amd64",
                            text));
  };
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t colon = text.find(':', start);
    parts.push_back(text.substr(start, colon == std::string_view::npos ? colon : colon - start));
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  DeviceFields f;
  f.key = std::string(parts[0]);
  std::string_view platform;
  if (f.key == "cuda" && parts.size() == 4 && parts[1].starts_with("sm_") &&
      parts[2].starts_with("cuda_")) {
    f.sm = std::string(parts[1]);
    f.cuda = std::string(parts[2].substr(5));
    platform = parts[3];
  } else if (f.key == "cpu" && parts.size() == 2) {
    platform = parts[1];
  } else {
    return fail();
  }
  auto slash = platform.find('/');
  if (slash == std::string_view::npos) return fail();
  f.os = std::string(platform.substr(0, slash));
  f.arch = std::string(platform.substr(slash + 1));
  try {
    return make_device(f);
  } catch (const Error&) {
    return fail();
  }
}

std::string local_os() {
  struct utsname u {};
  if (uname(&u) != 0) return "linux";
  std::string s = lower(u.sysname);
  return s;
}

std::string local_arch() {
  struct utsname u {};
  if (uname(&u) != 0) return "amd64";
  std::string m = u.machine;
  if (m == "x86_64") return "amd64";
  if (m == "aarch64" || m == "arm64") return "arm64";
  if (m == "i686" || m == "i386") return "386";
  if (m == "armv7l") return "arm";
  return lower(m);  // ppc64le, s390x, riscv64 match OCI names already
}

Device local_cpu_device() {
  Device d;
  d.key = "cpu";
  d.os = local_os();
  d.arch = local_arch();
  return d;
}

}  // namespace kh
