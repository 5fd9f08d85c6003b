// The library's version (kernel_hub.h "Versions"): the header's, as this library was built.
#include "kernel_hub/kernel_hub.h"
#include "kernel_hub/kernel_hub.hpp"

extern "C" const char* kh_version(void) {
  return KH_VERSION_STRING;
}

namespace kh {

const char* version() noexcept {
  return KH_VERSION_STRING;
}

}  // namespace kh
