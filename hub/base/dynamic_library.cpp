#include "hub/base/dynamic_library.h"

#include <dlfcn.h>

#include "hub/base/error.h"

namespace kh {

DynamicLibrary::DynamicLibrary(const char* soname, std::string install_hint)
    : soname_(soname), hint_(std::move(install_hint)) {
  // RTLD_LOCAL: the library's symbols stay out of the global namespace.
  handle_ = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    const char* why = ::dlerror();
    throw Error(ErrorKind::kUnsupported, std::string(soname) + " not found: " + hint_ +
                                             (why ? std::string(" [") + why + "]" : ""));
  }
}

void* DynamicLibrary::symbol(const char* name) const {
  void* sym = ::dlsym(handle_, name);
  if (sym == nullptr) {
    throw Error(ErrorKind::kUnsupported,
                std::string(soname_) + " has no " + name + ": it is too old; " + hint_);
  }
  return sym;
}

}  // namespace kh
