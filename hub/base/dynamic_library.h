// A shared library opened with dlopen on first use, its functions resolved by name into typed
// pointers. Used for libraries that most processes never need (libcurl, libarchive): linking
// them would map dozens of shared objects into every process.
#pragma once

#include <mutex>
#include <string>
#include <type_traits>

namespace kh {

class DynamicLibrary {
 public:
  // dlopen(soname, RTLD_NOW | RTLD_LOCAL). Throws kUnsupported "<soname> not found: <hint>".
  DynamicLibrary(const char* soname, std::string install_hint);

  // Sets `slot` to the function `name`. Throws kUnsupported naming the symbol and the hint.
  template <class Fn>
  void resolve(const char* name, Fn& slot) const {
    slot = reinterpret_cast<std::remove_reference_t<Fn>>(symbol(name));
  }

 private:
  void* symbol(const char* name) const;
  const char* soname_;
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

}  // namespace kh
