// Reading the environment: the one place that says what a flag, a number or an unset variable
// means, so that every KERNEL_HUB_* variable reads the same way.
#pragma once

#include <filesystem>
#include <string>

namespace kh {

// The variable's value, or "" when it is unset.
std::string env_string(const char* name);

// A boolean variable: 1/true/yes/on is true, unset, empty or 0/false/no/off is false (any case);
// anything else throws kh::Error (kInvalidInput) naming the variable and the accepted values.
bool env_flag(const char* name);

// A per-user directory: $override_var, else $xdg_var/<leaf> (absolute only, as XDG says), else
// $HOME/<home_subdir>/<leaf> (HOME, else the password database). Throws kInvalidInput when no
// home can be found, naming override_var.
std::filesystem::path user_dir(const char* override_var, const char* xdg_var,
                               const char* home_subdir, const char* leaf);

// The variable as a decimal integer; `fallback` when unset or empty. Throws kh::Error
// (kInvalidInput) naming the variable when it is not an integer >= min_value.
long env_long(const char* name, long fallback, long min_value);

}  // namespace kh
