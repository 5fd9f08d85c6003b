// The device a resolution targets: read from the machine, or given by hand so that a CPU build
// host can resolve and pre-fetch for a GPU fleet (--device cuda --sm 90 --cuda 13.0).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kh {

struct Device {
  std::string key = "cpu";  // KernelConfig device key: "cuda" or "cpu"
  // cuda only: compute capability major*10+minor (H100/H200: 90). Every sm_90 device also runs
  // sm_90a code, so "90a" given by hand is the same device as "90".
  int sm = 0;
  int cuda_major = 0;  // cuda only: the CUDA version the driver supports (cuDriverGetVersion)
  int cuda_minor = 0;
  std::string os = "linux";    // OCI platform.os
  std::string arch = "amd64";  // OCI platform.architecture (amd64, arm64, ...)

  bool is_cuda() const { return key == "cuda"; }
  // Canonical text, also the key of a lock file target and what parse_spec reads back:
  // "cuda:sm_90:cuda_13.0:linux/amd64", "cpu:linux/amd64".
  std::string str() const;
  // Human form for traces: "cuda sm_90, driver CUDA 13.0, linux/amd64".
  std::string describe() const;
  bool operator==(const Device&) const = default;
};

// Hand-given fields, as the CLI flags carry them. key: "cuda" or "cpu"; sm: "90", "9.0",
// "sm_90", "90a"; cuda: "13.0" or "13"; os/arch default to the local machine's.
struct DeviceFields {
  std::string key;
  std::optional<std::string> sm;
  std::optional<std::string> cuda;
  std::optional<std::string> os;
  std::optional<std::string> arch;
};

// Throws kInvalidInput naming the field and what is expected (a cuda device needs sm and cuda;
// cpu takes neither).
Device make_device(const DeviceFields& fields);

// Reads Device::str() back.
Device parse_device_spec(std::string_view text);

// "90" / "9.0" / "sm_90" / "90a" -> 90; nullopt when malformed.
std::optional<int> parse_sm(std::string_view text);
// "13.0" / "13" -> {13, 0}; nullopt when malformed.
std::optional<std::pair<int, int>> parse_cuda_version(std::string_view text);

// OCI os/architecture of this machine from uname(2): x86_64 -> amd64, aarch64 -> arm64.
std::string local_os();
std::string local_arch();
// The local CPU as a device.
Device local_cpu_device();

}  // namespace kh
