// libcurl, loaded on first use. Linking libcurl maps ~45 shared libraries (TLS, HTTP/2,
// Kerberos, LDAP, ...) into every process, which costs milliseconds of start-up even for
// commands that never touch the network; dlopen defers that cost to the first request.
#pragma once

#include <curl/curl.h>

namespace kh::http {

// The libcurl functions hub/transport/http.cpp calls. Each pointer has the exact type of the function
// declared in <curl/curl.h>, so a signature can never drift from the header.
struct CurlApi {
  decltype(&curl_global_init) global_init;
  decltype(&curl_easy_init) easy_init;
  decltype(&curl_easy_setopt) easy_setopt;
  decltype(&curl_easy_perform) easy_perform;
  decltype(&curl_easy_getinfo) easy_getinfo;
  decltype(&curl_easy_cleanup) easy_cleanup;
  decltype(&curl_easy_strerror) easy_strerror;
  decltype(&curl_multi_init) multi_init;
  decltype(&curl_multi_setopt) multi_setopt;
  decltype(&curl_multi_add_handle) multi_add_handle;
  decltype(&curl_multi_remove_handle) multi_remove_handle;
  decltype(&curl_multi_perform) multi_perform;
  decltype(&curl_multi_poll) multi_poll;
  decltype(&curl_multi_info_read) multi_info_read;
  decltype(&curl_multi_cleanup) multi_cleanup;
  decltype(&curl_share_init) share_init;
  decltype(&curl_share_setopt) share_setopt;
  decltype(&curl_share_cleanup) share_cleanup;
  decltype(&curl_slist_append) slist_append;
  decltype(&curl_slist_free_all) slist_free_all;
};

// Loads libcurl.so.4 once per process (thread-safe) and returns its function table. Throws
// kh::Error(kUnsupported) naming the library or symbol and what to install when it is missing;
// a later call tries again.
const CurlApi& curl_api();

}  // namespace kh::http
