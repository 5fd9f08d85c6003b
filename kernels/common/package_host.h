// Host-library plumbing every kernel package shares: the host table the loader handed us, error
// reporting through host->set_error, and launching device kernels through the loader.
// Compiled into each package's host library (hidden visibility; nothing here is exported).
#pragma once

#include <stdint.h>

#include "loader/kernel_hub_abi.h"

namespace khk {

// Validates the loader's host table (ABI major, struct size) and remembers it. Returns false
// after reporting through the table when it is too old for `package`.
bool accept_host(const kh_host_v1_t* h, const char* package);

// The table accepted by accept_host, or nullptr before the entry point ran.
const kh_host_v1_t* host();

// Reports a printf-style message through host->set_error and returns `status`.
int32_t fail(int32_t status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Grid and block of one launch.
struct LaunchDims {
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t shared_mem_bytes = 0;
};

// Looks up `kernel` for `device_id` through host->get_function and launches it on `stream`
// with `params` (pointers to each kernel parameter). The loader sets the error on failure.
int32_t launch_kernel(int32_t device_id, const char* kernel, const LaunchDims& dims, void** params,
                      void* stream);

}  // namespace khk
