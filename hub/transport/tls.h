// Where TLS trust and client certificates come from, as the ecosystem keeps them:
//  - the CA file: KERNEL_HUB_CA_BUNDLE, else SSL_CERT_FILE, else CURL_CA_BUNDLE (else libcurl's
//    system bundle); SSL_CERT_DIR (an OpenSSL hashed directory, `openssl rehash`) is used too,
//    unless KERNEL_HUB_CA_BUNDLE is set (it alone then decides);
//  - per registry, certs.d/HOST[:PORT]/ as docker and podman read it: every *.crt is a CA trusted
//    for that host, a *.cert with the *.key of the same name is the client certificate (mTLS).
//    The directories searched are $KERNEL_HUB_CERTS_D (':'-separated) when set, else
//    ~/.config/containers/certs.d, /etc/containers/certs.d, /etc/docker/certs.d; the first
//    holding HOST:PORT (else HOST) wins.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace kh::http {

struct CaSettings {
  std::string file;        // "" = libcurl's default
  std::string dir;         // "" = libcurl's default
  std::string origin;      // the variable(s) that set them, for messages ("" = system defaults)
  bool exclusive = false;  // KERNEL_HUB_CA_BUNDLE: its file alone (no default directory either)
  static CaSettings from_env();
};

struct CertsD {
  std::filesystem::path dir;  // the certs.d/HOST[:PORT] directory used ("" = none)
  std::string ca_pem;         // the *.crt files, concatenated
  std::string client_cert;    // *.cert path ("" = none)
  std::string client_key;     // its *.key path
};

// The certs.d directories searched, in order.
std::vector<std::filesystem::path> certs_d_roots();
// The certs.d entry for `host` (host[:port] as in the URL). Unreadable files throw kIo naming them.
CertsD certs_d_for(const std::string& host);

// What to set when a TLS handshake with `host` failed: the variables, the certs.d path, and for
// a client-certificate problem the .cert/.key pair.
std::string tls_hint(const std::string& host, const CaSettings& ca, const CertsD& certs);

}  // namespace kh::http
