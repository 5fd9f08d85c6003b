#include "hub/curl_api.h"

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <type_traits>

#include "hub/error.h"

namespace kh::http {

namespace {

constexpr const char* kLibrary = "libcurl.so.4";

CurlApi load() {
  // RTLD_LOCAL: libcurl's symbols stay out of the global namespace, nothing else binds to them.
  void* lib = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    throw Error(ErrorKind::kUnsupported,
                std::string(kLibrary) + " not found: install Debian's libcurl4 (network access " +
                    "needs it)" + (why ? std::string(" [") + why + "]" : std::string()));
  }
  CurlApi api{};
  auto resolve = [&](const char* name, auto& slot) {
    void* sym = ::dlsym(lib, name);
    if (sym == nullptr) {
      ::dlclose(lib);
      throw Error(ErrorKind::kUnsupported,
                  std::string(kLibrary) + " has no " + name +
                      ": it is too old; install a current Debian libcurl4 (7.68 or newer)");
    }
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(sym);
  };
#define KH_CURL_RESOLVE(field) resolve("curl_" #field, api.field)
  KH_CURL_RESOLVE(global_init);
  KH_CURL_RESOLVE(easy_init);
  KH_CURL_RESOLVE(easy_setopt);
  KH_CURL_RESOLVE(easy_perform);
  KH_CURL_RESOLVE(easy_getinfo);
  KH_CURL_RESOLVE(easy_cleanup);
  KH_CURL_RESOLVE(easy_strerror);
  KH_CURL_RESOLVE(multi_init);
  KH_CURL_RESOLVE(multi_setopt);
  KH_CURL_RESOLVE(multi_add_handle);
  KH_CURL_RESOLVE(multi_remove_handle);
  KH_CURL_RESOLVE(multi_perform);
  KH_CURL_RESOLVE(multi_poll);
  KH_CURL_RESOLVE(multi_info_read);
  KH_CURL_RESOLVE(multi_cleanup);
  KH_CURL_RESOLVE(share_init);
  KH_CURL_RESOLVE(share_setopt);
  KH_CURL_RESOLVE(share_cleanup);
  KH_CURL_RESOLVE(slist_append);
  KH_CURL_RESOLVE(slist_free_all);
#undef KH_CURL_RESOLVE
  // The library stays loaded for the life of the process: handles may outlive any caller.
  return api;
}

}  // namespace

const CurlApi& curl_api() {
  static std::once_flag once;
  static CurlApi api{};
  // A throwing load leaves the flag unset, so a later call tries again.
  std::call_once(once, [] { api = load(); });
  return api;
}

}  // namespace kh::http
