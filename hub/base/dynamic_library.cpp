#include "hub/base/dynamic_library.h"

#include <dlfcn.h>

#include "hub/base/error.h"

namespace kh {

namespace {

// RTLD_LOCAL: the library's symbols stay out of the global namespace.
void* open_library(const std::string& name, std::string& why) {
  ::dlerror();
  void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = ::dlerror();
    why = e ? e : "dlopen failed";
  }
  return handle;
}

}  // namespace

DynamicLibrary::DynamicLibrary(std::string name, std::string install_hint)
    : name_(std::move(name)), hint_(std::move(install_hint)) {
  std::string why;
  handle_ = open_library(name_, why);
  if (handle_ == nullptr)
    throw Error(ErrorKind::kUnsupported, name_ + " not found: " + hint_ + " [" + why + "]");
}

std::optional<DynamicLibrary> DynamicLibrary::try_open(const std::string& name, std::string& why) {
  void* handle = open_library(name, why);
  if (handle == nullptr) return std::nullopt;
  return DynamicLibrary(name, handle);
}

std::optional<DynamicLibrary> DynamicLibrary::open_first(const std::vector<std::string>& names,
                                                         std::string& tried) {
  for (const std::string& name : names) {
    std::string why;
    std::optional<DynamicLibrary> lib = try_open(name, why);
    if (lib) return lib;
    tried += "\n  " + name + ": " + why;
  }
  return std::nullopt;
}

void* DynamicLibrary::address(const char* symbol) const {
  return ::dlsym(handle_, symbol);
}

void DynamicLibrary::missing(const char* symbol) const {
  throw Error(ErrorKind::kUnsupported, name_ + " has no " + symbol + ": it is too old; " + hint_);
}

std::unique_ptr<Error> load_failure(std::exception_ptr thrown, const char* what) {
  try {
    std::rethrow_exception(thrown);
  } catch (const Error& e) {
    return std::make_unique<Error>(e);
  } catch (const std::exception& e) {
    return std::make_unique<Error>(ErrorKind::kIo,
                                   std::string("loading ") + what + " failed: " + e.what());
  } catch (...) {
    return std::make_unique<Error>(ErrorKind::kIo, std::string("loading ") + what + " failed");
  }
}

}  // namespace kh
