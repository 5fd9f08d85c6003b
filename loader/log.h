// The loader's log: one process-wide sink for the loader's own lines and for packages' host->log.
// Not on any hot path (binding, loading, refusals), so a mutex guards the sink.
#pragma once

#include <functional>
#include <string>

#include "kernel_hub/kernel_hub_abi.h"

namespace kh {

// Receives (level KH_LOG_*, line). The default sink writes KH_LOG_WARN and above to stderr,
// prefixed "kernel-hub: ".
using LogSink = std::function<void(int level, const std::string& line)>;

// Replaces the sink; an empty function restores the default. Returns the previous sink.
LogSink set_log_sink(LogSink sink);
void log_line(int level, const std::string& line);

}  // namespace kh
