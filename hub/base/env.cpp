#include "hub/base/env.h"

#include <cstdlib>

#include "hub/base/error.h"

namespace kh {

std::string env_string(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool env_flag(const char* name) {
  std::string v = env_string(name);
  return !v.empty() && v != "0" && v != "false";
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
