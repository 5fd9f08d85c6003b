// A shared library opened with dlopen on first use, its functions resolved by name into typed
// pointers. Used for libraries that most processes never need (libcurl, libarchive) or that a
// machine may lack (the CUDA driver, NVRTC): linking them would map dozens of shared objects into
// every process, or fail to start without them.
//
// Each user names every function once, in an X-macro list (KH_CURL_FUNCTIONS, ...) that both
// declares its table's typed pointers and resolves them here by name.
#pragma once

#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "hub/base/error.h"

namespace kh {

class DynamicLibrary {
 public:
  // dlopen(name, RTLD_NOW | RTLD_LOCAL). Throws kUnsupported "<name> not found: <hint>".
  DynamicLibrary(std::string name, std::string install_hint);

  // As the constructor, without throwing: nullopt, with dlerror's reason in `why`, when `name`
  // does not open (for callers that try several names or report the failure their own way).
  static std::optional<DynamicLibrary> try_open(const std::string& name, std::string& why);

  // The first of `names` that opens; nullopt when none does, with one line per name tried
  // ("\n  NAME: reason") appended to `tried` for the caller's error message.
  static std::optional<DynamicLibrary> open_first(const std::vector<std::string>& names,
                                                  std::string& tried);

  const std::string& name() const { return name_; }

  // Sets `slot` to the function `symbol`, or to null and returns false when the library lacks it.
  template <class Fn>
  bool find(const char* symbol, Fn& slot) const {
    slot = reinterpret_cast<std::remove_reference_t<Fn>>(address(symbol));
    return slot != nullptr;
  }

  // Sets `slot` to the function `symbol`. Throws kUnsupported naming the symbol and the hint.
  template <class Fn>
  void resolve(const char* symbol, Fn& slot) const {
    if (!find(symbol, slot)) missing(symbol);
  }

 private:
  DynamicLibrary(std::string name, void* handle) : name_(std::move(name)), handle_(handle) {}
  void* address(const char* symbol) const;
  [[noreturn]] void missing(const char* symbol) const;
  std::string name_;
  std::string hint_;
  void* handle_;  // never closed: handles and callbacks may outlive any caller
};

// The table `load()` fills, loaded once per process; a load that throws is tried again by the
// next caller.
template <class Table, class Load>
const Table& load_once(Load load) {
  static std::once_flag once;
  static Table table{};
  std::call_once(once, [&] { table = load(); });
  return table;
}

// The error a library load threw, kept for every later caller: an Error as it is, anything else
// as kIo "loading WHAT failed: ...".
std::unique_ptr<Error> load_failure(std::exception_ptr thrown, const char* what);

// Runs `load` once per process; when it throws, this and every later call throw the same error
// without trying again (a missing CUDA library stays missing for the process).
template <class Load>
void load_once_or_throw(std::once_flag& once, std::unique_ptr<Error>& failure, const char* what,
                        Load&& load) {
  std::call_once(once, [&] {
    try {
      load();
    } catch (...) {
      failure = load_failure(std::current_exception(), what);
    }
  });
  if (failure) throw *failure;
}

}  // namespace kh
