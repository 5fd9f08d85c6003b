#include "loader/cuda_library_names.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace kh {

std::vector<std::string> cuda_library_candidates(const char* env_var, const std::string& stem) {
  const std::string names[] = {stem + ".so.13", stem + ".so.12"};
  std::vector<std::string> c;
  if (const char* env = std::getenv(env_var); env && *env) {
    std::error_code ec;
    if (std::filesystem::is_directory(env, ec)) {
      for (const std::string& n : names) c.push_back((std::filesystem::path(env) / n).string());
    } else {
      c.push_back(env);
    }
  }
  for (const std::string& n : names) c.push_back(n);
  for (const std::string& n : names) c.push_back("/usr/local/cuda/lib64/" + n);
  return c;
}

}  // namespace kh
