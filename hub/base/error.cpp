#include "hub/base/error.h"

#include <cerrno>
#include <cstring>

namespace kh {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidInput:
      return "invalid_input";
    case ErrorKind::kNotFound:
      return "not_found";
    case ErrorKind::kNetwork:
      return "network";
    case ErrorKind::kAuth:
      return "auth";
    case ErrorKind::kIntegrity:
      return "integrity";
    case ErrorKind::kOffline:
      return "offline";
    case ErrorKind::kIo:
      return "io";
    case ErrorKind::kUnsupported:
      return "unsupported";
    case ErrorKind::kRefused:
      return "refused";
  }
  return "unknown";
}

void throw_errno(const std::string& what) {
  int e = errno;
  throw Error(ErrorKind::kIo, what + ": " + std::strerror(e));
}

}  // namespace kh
