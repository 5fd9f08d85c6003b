#include "hub/transport/curl_api.h"

#include "hub/base/dynamic_library.h"

namespace kh::http {

namespace {

CurlApi load() {
  DynamicLibrary lib("libcurl.so.4",
                     "install Debian's libcurl4, 7.68 or newer (network access needs it)");
  CurlApi api{};
#define KH_CURL_RESOLVE(f) lib.resolve("curl_" #f, api.f);
  KH_CURL_FUNCTIONS(KH_CURL_RESOLVE)
#undef KH_CURL_RESOLVE
  return api;
}

}  // namespace

const CurlApi& curl_api() {
  return load_once<CurlApi>(load);
}

}  // namespace kh::http
