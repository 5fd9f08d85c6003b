// Fuzz target: docker config.json and containers auth.json are written by many tools and by
// hand, and a credential helper's reply is another program's output.
#include <cstddef>
#include <cstdint>
#include <string>

#include "hub/base/error.h"
#include "hub/transport/docker_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    kh::parse_helper_reply(text, "fuzz helper");
  } catch (const kh::Error&) {
  }
  kh::DockerConfig config;
  try {
    config = kh::parse_docker_config(text, "fuzz.json");
  } catch (const kh::Error&) {
    return 0;
  }
  // Every key the file names finds an entry (or helper) under its own host.
  for (const auto& [key, entry] : config.auths) {
    const std::string host = kh::registry_key_host(key);
    if (kh::registry_key_host(host) != host) __builtin_trap();  // normalising is idempotent
    if (!config.auth_for(host)) __builtin_trap();
    if (!config.auth_for(key)) __builtin_trap();
  }
  for (const auto& [key, name] : config.cred_helpers) {
    if (config.helper_for(kh::registry_key_host(key)).empty()) __builtin_trap();
    if (name.find('/') != std::string::npos) __builtin_trap();  // never names another path
  }
  if (config.creds_store.find('/') != std::string::npos) __builtin_trap();
  return 0;
}
