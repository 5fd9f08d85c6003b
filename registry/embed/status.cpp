#include "registry/embed/status.h"

#include "kernel_hub/kernel_hub_abi.h"

namespace kh {

// No default case: a new ErrorKind does not compile (-Wswitch) until it has its status.
int32_t status_of(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidInput:
      return KH_ERR_INVALID_ARGUMENT;
    case ErrorKind::kNotFound:
      return KH_ERR_NOT_FOUND;
    case ErrorKind::kNetwork:
      return KH_ERR_NETWORK;
    case ErrorKind::kAuth:
      return KH_ERR_AUTH;
    case ErrorKind::kIntegrity:
      return KH_ERR_INTEGRITY;
    case ErrorKind::kOffline:
      return KH_ERR_OFFLINE;
    case ErrorKind::kIo:
      return KH_ERR_IO;
    case ErrorKind::kUnsupported:
      return KH_ERR_UNSUPPORTED;
    case ErrorKind::kRefused:
      return KH_ERR_REFUSED;
  }
  return KH_ERR_INTERNAL;  // not an ErrorKind value
}

const char* status_name(int32_t status) {
  switch (status) {
    case KH_OK:
      return "KH_OK";
    case KH_ERR_INVALID_ARGUMENT:
      return "KH_ERR_INVALID_ARGUMENT";
    case KH_ERR_UNSUPPORTED:
      return "KH_ERR_UNSUPPORTED";
    case KH_ERR_NO_DEVICE:
      return "KH_ERR_NO_DEVICE";
    case KH_ERR_NOT_FOUND:
      return "KH_ERR_NOT_FOUND";
    case KH_ERR_LAUNCH:
      return "KH_ERR_LAUNCH";
    case KH_ERR_ABI:
      return "KH_ERR_ABI";
    case KH_ERR_INTERNAL:
      return "KH_ERR_INTERNAL";
    case KH_ERR_REFUSED:
      return "KH_ERR_REFUSED";
    case KH_ERR_NETWORK:
      return "KH_ERR_NETWORK";
    case KH_ERR_AUTH:
      return "KH_ERR_AUTH";
    case KH_ERR_INTEGRITY:
      return "KH_ERR_INTEGRITY";
    case KH_ERR_OFFLINE:
      return "KH_ERR_OFFLINE";
    case KH_ERR_IO:
      return "KH_ERR_IO";
  }
  return "unknown status";
}

}  // namespace kh
