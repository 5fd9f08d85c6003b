// Reading the environment: the one place that says what a flag, a number or an unset variable
// means, so that every KERNEL_HUB_* variable reads the same way.
#pragma once

#include <string>

namespace kh {

// The variable's value, or "" when it is unset.
std::string env_string(const char* name);

// True when the variable is set, non-empty and not "0" or "false".
bool env_flag(const char* name);

// The variable as a decimal integer; `fallback` when unset or empty. Throws kh::Error
// (kInvalidInput) naming the variable when it is not an integer >= min_value.
long env_long(const char* name, long fallback, long min_value);

}  // namespace kh
