#include "registry/embed/c_guard.h"

#include <fmt/format.h>

#include "kernel_hub/kernel_hub.h"

namespace kh::capi {

thread_local std::string t_last_error;

int32_t null_argument(const char* what) {
  t_last_error = fmt::format("{} must not be NULL", what);
  return KH_ERR_INVALID_ARGUMENT;
}

}  // namespace kh::capi

// Here rather than in c_api.cpp so that in-tree tools linking kh_embed (the device API's C++
// classes) have them too.
extern "C" {

const char* kh_last_error(void) {
  return kh::capi::t_last_error.c_str();
}

const char* kh_status_name(int32_t status) {
  return kh::status_name(status);
}

}  // extern "C"
