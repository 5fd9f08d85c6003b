// What every C API function shares (c_api.cpp, c_api_device.cpp): this thread's last error
// message (kh_last_error) and the guard that turns exceptions into a status and that message.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include "kernel_hub/kernel_hub_abi.h"
#include "kernel_hub/kernel_hub_base.hpp"
#include "registry/embed/status.h"

namespace kh::capi {

// This thread's last error message (kh_last_error()).
extern thread_local std::string t_last_error;

// Runs `body`, mapping exceptions to a status and this thread's message.
template <typename F>
int32_t guarded(F&& body) noexcept {
  try {
    t_last_error.clear();
    body();
    return KH_OK;
  } catch (const kh::Error& e) {
    t_last_error = e.what();
    return kh::status_of(e.kind());
  } catch (const std::exception& e) {
    t_last_error = e.what();
    return KH_ERR_INTERNAL;
  } catch (...) {
    t_last_error = "unknown exception";
    return KH_ERR_INTERNAL;
  }
}

// KH_ERR_INVALID_ARGUMENT with "<what> must not be NULL".
int32_t null_argument(const char* what);

}  // namespace kh::capi
