// Errors the hub raises. Every message says what failed, on which input, and what to do.
// kh::Error and kh::ErrorKind are public (embedders catch them): they live in
// include/kernel_hub/kernel_hub_base.hpp.
#pragma once

#include <string>

#include "kernel_hub/kernel_hub_base.hpp"

namespace kh {

// Throws kIo with the message plus strerror(errno).
[[noreturn]] void throw_errno(const std::string& what);

}  // namespace kh
