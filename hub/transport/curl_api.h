// libcurl, loaded on first use. Linking libcurl maps ~45 shared libraries (TLS, HTTP/2,
// Kerberos, LDAP, ...) into every process, which costs milliseconds of start-up even for
// commands that never touch the network; dlopen defers that cost to the first request.
#pragma once

#include <curl/curl.h>

namespace kh::http {

// The libcurl functions hub/transport/http.cpp calls, each named once: X(f) stands for
// curl_<f>, CurlApi's field f.
#define KH_CURL_FUNCTIONS(X) \
  X(global_init)             \
  X(easy_init)               \
  X(easy_setopt)             \
  X(easy_perform)            \
  X(easy_getinfo)            \
  X(easy_cleanup)            \
  X(easy_strerror)           \
  X(multi_init)              \
  X(multi_setopt)            \
  X(multi_add_handle)        \
  X(multi_remove_handle)     \
  X(multi_perform)           \
  X(multi_poll)              \
  X(multi_info_read)         \
  X(multi_cleanup)           \
  X(share_init)              \
  X(share_setopt)            \
  X(share_cleanup)           \
  X(slist_append)            \
  X(slist_free_all)

// Each pointer has the exact type of the function declared in <curl/curl.h>, so a signature can
// never drift from the header.
struct CurlApi {
#define KH_CURL_FIELD(f) decltype(&curl_##f) f;
  KH_CURL_FUNCTIONS(KH_CURL_FIELD)
#undef KH_CURL_FIELD
};

// Loads libcurl.so.4 once per process (thread-safe) and returns its function table. Throws
// kh::Error(kUnsupported) naming the library or symbol and what to install when it is missing;
// a later call tries again.
const CurlApi& curl_api();

}  // namespace kh::http
