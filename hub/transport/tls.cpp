#include "hub/transport/tls.h"

#include <algorithm>

#include "hub/base/env.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"

namespace kh::http {

namespace {
constexpr uint64_t kMaxCaFileBytes = 16 << 20;
}  // namespace

CaSettings CaSettings::from_env() {
  CaSettings s;
  if (std::string v = env_string("KERNEL_HUB_CA_BUNDLE"); !v.empty()) {
    s.file = v;
    s.origin = "KERNEL_HUB_CA_BUNDLE=" + v;
    s.exclusive = true;
    return s;
  }
  for (const char* name : {"SSL_CERT_FILE", "CURL_CA_BUNDLE"}) {
    if (std::string v = env_string(name); !v.empty()) {
      s.file = v;
      s.origin = std::string(name) + "=" + v;
      break;
    }
  }
  if (std::string v = env_string("SSL_CERT_DIR"); !v.empty()) {
    s.dir = v;
    s.origin += (s.origin.empty() ? "" : ", ") + std::string("SSL_CERT_DIR=") + v;
  }
  return s;
}

std::vector<std::filesystem::path> certs_d_roots() {
  std::vector<std::filesystem::path> roots;
  if (std::string v = env_string("KERNEL_HUB_CERTS_D"); !v.empty()) {
    for (size_t i = 0; i <= v.size();) {
      size_t colon = std::min(v.find(':', i), v.size());
      if (colon > i) roots.emplace_back(v.substr(i, colon - i));
      i = colon + 1;
    }
    return roots;
  }
  try {
    roots.push_back(user_dir("", "XDG_CONFIG_HOME", ".config", "containers/certs.d"));
  } catch (const Error&) {  // no home directory: the system directories only
  }
  roots.emplace_back("/etc/containers/certs.d");
  roots.emplace_back("/etc/docker/certs.d");
  return roots;
}

CertsD certs_d_for(const std::string& host) {
  CertsD c;
  std::vector<std::string> names{host};
  if (size_t colon = host.rfind(':');
      colon != std::string::npos && host.find(']', colon) == std::string::npos) {
    names.push_back(host.substr(0, colon));
  }
  std::error_code ec;
  for (const auto& root : certs_d_roots()) {
    for (const auto& name : names) {
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        continue;
      if (std::filesystem::is_directory(root / name, ec)) {
        c.dir = root / name;
        break;
      }
    }
    if (!c.dir.empty()) break;
  }
  if (c.dir.empty()) return c;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(c.dir, ec)) files.push_back(e.path());
  std::sort(files.begin(), files.end());  // a deterministic choice among several client certs
  for (const auto& f : files) {
    if (f.extension() == ".crt") {
      c.ca_pem += fs::read_file(f, kMaxCaFileBytes);
      c.ca_pem += "\n";
    } else if (f.extension() == ".cert" && c.client_cert.empty()) {
      std::filesystem::path key = f;
      key.replace_extension(".key");
      if (!std::filesystem::exists(key, ec)) {
        throw Error(ErrorKind::kInvalidInput,
                    "client certificate " + f.string() + " has no key " + key.string() +
                        " next to it (certs.d pairs NAME.cert with NAME.key); add the key or "
                        "remove the certificate");
      }
      c.client_cert = f.string();
      c.client_key = key.string();
    }
  }
  return c;
}

std::string tls_hint(const std::string& host, const CaSettings& ca, const CertsD& certs) {
  std::string used = ca.origin.empty() ? "the system CA bundle" : ca.origin;
  if (!certs.dir.empty()) used += " and " + certs.dir.string();
  std::string where = certs_d_roots().front().string() + "/" + host;
  return "trusted CAs were " + used + "; to trust the CA that signed " + host +
         "'s certificate, set KERNEL_HUB_CA_BUNDLE (or SSL_CERT_FILE, CURL_CA_BUNDLE; or "
         "SSL_CERT_DIR for a hashed directory) to its PEM file, or put it in " +
         where + "/ca.crt (certs.d; a client certificate for mTLS goes in " + where +
         "/client.cert with client.key)";
}

}  // namespace kh::http
