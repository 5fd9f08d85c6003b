// Errors the hub raises. Every message says what failed, on which input, and what to do.
#pragma once

#include <stdexcept>
#include <string>

namespace kh {

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

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Name of an error kind for --json output and logs.
const char* error_kind_name(ErrorKind kind);

// Throws kIo with the message plus strerror(errno).
[[noreturn]] void throw_errno(const std::string& what);

}  // namespace kh
