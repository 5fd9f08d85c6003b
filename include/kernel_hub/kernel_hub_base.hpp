// kernel_hub_base.hpp: what the C++ embedding API (kernel_hub.hpp, which includes this file)
// shares with every part of kernel-hub: its error type and its log sink. Embedders include
// kernel_hub.hpp; the hub's utilities (hub/base/error.h, hub/base/log.h) include this file, so
// that an embedder catches and logs exactly what the hub, the registry and the loader raise.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace kh {

// ---- Errors ----

// What kind of failure a kh::Error is. The C API returns one KH_ERR_* status per kind
// (kernel_hub.h).
enum class ErrorKind {
  kInvalidInput,  // malformed ref, address, JSON, manifest: fix the input
  kNotFound,      // ref, tag, blob or manifest the hub does not have
  kNetwork,       // transport failure after retries
  kAuth,          // 401/403 after re-authentication
  kIntegrity,     // digest or size mismatch, damaged cache entry
  kOffline,       // offline mode and the cache cannot answer
  kIo,            // local file system failure
  kUnsupported,   // a server or file uses something we do not handle
  kRefused,       // a safety rule refused the input (archive limits, ELF checks)
};

// Every message says what failed, on which input, and what to do.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Name of an error kind for --json output and logs: "invalid_input", "not_found", ...
const char* error_kind_name(ErrorKind kind);

// ---- Log ----

// Log levels; the same values as KH_LOG_* in kernel_hub_abi.h (packages log through the sink
// too, via their host table).
enum LogLevel : int { kLogDebug = 0, kLogInfo = 1, kLogWarn = 2, kLogError = 3 };

// Receives (level, line) for every line kernel-hub logs: the hub's warnings (damaged cache
// entries, trust files, registry warnings), the loader's and kernelize's lines, and packages'
// own log calls. Lines carry no level word and no "kernel-hub:" prefix.
//
// The default sink writes kLogWarn and above to stderr as "kernel-hub: warning: <line>" or
// "kernel-hub: error: <line>". Sinks may be called from any thread, one call at a time.
using LogSink = std::function<void(int level, const std::string& line)>;

// Replaces the process-wide sink; an empty function restores the default. Returns the previous
// sink. Not for a hot path (a mutex guards the sink).
LogSink set_log_sink(LogSink sink);

}  // namespace kh
