#include "loader/cuda_arch.h"

namespace kh {

std::optional<CudaArch> CudaArch::parse(std::string_view text) {
  if (text.starts_with("sm_")) text.remove_prefix(3);
  CudaArch a;
  if (!text.empty() && (text.back() == 'a' || text.back() == 'f')) {
    a.suffix = text.back();
    text.remove_suffix(1);
  }
  if (text.size() < 2 || text.size() > 3) return std::nullopt;
  int value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  a.major = value / 10;
  a.minor = value % 10;
  if (a.major < 1) return std::nullopt;
  return a;
}

std::string CudaArch::number() const {
  std::string s = std::to_string(major * 10 + minor);
  if (suffix) s += suffix;
  return s;
}

bool cubin_runs_on(const CudaArch& code, const CudaArch& gpu) {
  if (code.major != gpu.major) return false;
  if (code.suffix) return code.minor == gpu.minor;
  return code.minor <= gpu.minor;
}

}  // namespace kh
