#include "hub/transport/curl_api.h"

#include "hub/base/dynamic_library.h"

namespace kh::http {

namespace {

CurlApi load() {
  DynamicLibrary lib("libcurl.so.4",
                     "install Debian's libcurl4, 7.68 or newer (network access needs it)");
  CurlApi api{};
#define KH_CURL_RESOLVE(field) lib.resolve("curl_" #field, api.field)
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
  return api;
}

}  // namespace

const CurlApi& curl_api() {
  return load_once<CurlApi>(load);
}

}  // namespace kh::http
