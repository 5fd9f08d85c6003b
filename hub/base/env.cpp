#include "hub/base/env.h"

#include <pwd.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>

#include "hub/base/error.h"

namespace kh {

std::string env_string(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool env_flag(const char* name) {
  std::string v = env_string(name);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v.empty() || v == "0" || v == "false" || v == "no" || v == "off") return false;
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  throw Error(ErrorKind::kInvalidInput,
              std::string(name) + "='" + env_string(name).substr(0, 64) +
                  "' is not a boolean: use 1 or 0 (also true/false, yes/no, on/off)");
}

std::filesystem::path user_dir(const char* override_var, const char* xdg_var,
                               const char* home_subdir, const char* leaf) {
  if (std::string v = env_string(override_var); !v.empty()) return v;
  // The XDG spec says relative paths in XDG_* variables are invalid and must be ignored.
  if (std::string v = env_string(xdg_var); !v.empty() && v.front() == '/')
    return std::filesystem::path(v) / leaf;
  std::string home = env_string("HOME");
  if (home.empty()) {
    if (const struct passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir) home = pw->pw_dir;
  }
  if (home.empty())
    throw Error(ErrorKind::kInvalidInput, std::string("cannot find ") + leaf +
                                              " under a home directory: set " + override_var +
                                              " (or HOME)");
  return std::filesystem::path(home) / home_subdir / leaf;
}

long env_long(const char* name, long fallback, long min_value) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != 0 || x < min_value) {
    throw Error(ErrorKind::kInvalidInput,
                std::string("invalid ") + name + "='" + v +
                    "': expected an integer >= " + std::to_string(min_value));
  }
  return x;
}

}  // namespace kh
