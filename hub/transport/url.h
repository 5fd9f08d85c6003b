// The parts of an http(s) URL the client decides by: its host, as a registry address spells it,
// and its origin. Plain string functions: URLs come from servers (redirects, token realms).
#pragma once

#include <string>

namespace kh::http {

// "host[:port]" of an http(s) URL, as HubAddress::host spells a registry (any user:password@
// left out).
std::string host_of(const std::string& url);

// The scheme of an absolute URL, lower-cased ("https"); "" when it has none (or what stands
// before "://" is not a scheme's characters).
std::string scheme_of(const std::string& url);

// "scheme://host[:port]" of an absolute URL, lower-cased, any user:password@ left out: what
// decides whether a request may carry another's credentials. An explicit default port
// ("https://h:443") counts as another origin than none: the stricter reading, which at worst
// drops credentials a server would have accepted. "" when `url` has no scheme.
std::string origin_of(const std::string& url);

// A URL for messages: its origin and path, any user:password@, query and fragment left out (a
// query may carry a storage signature or an upload's state). `url` itself when it has no scheme.
std::string shown_url(const std::string& url);

}  // namespace kh::http
