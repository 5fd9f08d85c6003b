// The process-wide log: one sink (set_log_sink, public in kernel_hub_base.hpp) for the hub's
// warnings, the loader's and the registry's lines, and packages' host->log. Not on any hot path
// (binding, loading, refusals, damaged cache entries), so a mutex guards the sink.
#pragma once

#include <string>
#include <string_view>

#include "kernel_hub/kernel_hub_base.hpp"

namespace kh {

// Hands the line to the sink (level: kLogDebug..kLogError, the values of KH_LOG_*).
void log_line(int level, const std::string& line);
// log_line(kLogWarn, line): printed by default as "kernel-hub: warning: <line>".
void log_warning(const std::string& line);

// `text` with control characters (but newline and tab) written as \xNN: hub-supplied text (error
// bodies, Warning headers, names) can carry escape sequences that would drive the terminal.
// The default sink and the CLI print through it.
std::string terminal_safe(std::string_view text);

}  // namespace kh
