// The C API's statuses: one KH_ERR_* per kh::ErrorKind, and their names. The one place that
// maps between the two (c_api.cpp returns these; kernel_hub.h documents them).
#pragma once

#include <cstdint>

#include "kernel_hub/kernel_hub_base.hpp"

namespace kh {

// The KH_ERR_* status of an error kind; never KH_OK or KH_ERR_INTERNAL.
int32_t status_of(ErrorKind kind);

// "KH_OK", "KH_ERR_OFFLINE", ...; "unknown status" for a value no header defines.
const char* status_name(int32_t status);

}  // namespace kh
