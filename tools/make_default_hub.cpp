// Builds the embedded default hub at build time: a layout hub directory with one repository per
// package, each packed by the library of `kernel-hub pack` (registry/pack.h): loader preflight,
// kernel.json with every file's SHA-256, tags v<major> and the exact version, reproducible.
// Usage: make_default_hub HUB_DIR REPO=PACKAGE_DIR [REPO=PACKAGE_DIR ...]
//   e.g. make_default_hub build/default-hub kernel-hub/example=build/example-package
//        make_default_hub --keygen   (once per build tree, before any packing)
// Every tag is signed with the build's default-hub key (hub/hub.h default_hub_key_dir()), whose
// public half the build trusts for kernel-hub/*, so the default hub passes the same signature
// checks as any remote hub.
// A package with CUDA device source gets a cuda variant too (cubins by NVRTC for the default sm
// list; source only when NVRTC is not installed) besides its cpu variant.
#include <cstdio>
#include <ctime>
#include <string>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/hub.h"
#include "hub/trust/signature.h"
#include "loader/nvrtc.h"
#include "loader/package_dir.h"
#include "registry/pack.h"

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--keygen") {
    try {
      using namespace kh;
      auto dir = default_hub_key_dir();
      fs::make_dirs(dir);
      if (!std::filesystem::exists(dir / "signing.pem"))
        trust::PrivateKey::generate().save(dir / "signing.pem");
      trust::PrivateKey key = trust::PrivateKey::load(dir / "signing.pem");
      fs::write_file_atomic(dir / "signing.pub", key.public_key().pem(), 0644);
      std::printf("default hub signing key %s\n", key.public_key().key_id().c_str());
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "make_default_hub --keygen: %s\n", e.what());
      return 1;
    }
  }
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s HUB_DIR REPO=PACKAGE_DIR [REPO=PACKAGE_DIR ...]\n", argv[0]);
    return 2;
  }
  try {
    using namespace kh;
    const std::filesystem::path hub_dir = argv[1];
    fs::make_dirs(hub_dir);
    const trust::PrivateKey key = trust::PrivateKey::load(default_hub_key_dir() / "signing.pem");
    for (int i = 2; i < argc; ++i) {
      std::string arg = argv[i];
      auto eq = arg.find('=');
      if (eq == std::string::npos) {
        std::fprintf(stderr, "make_default_hub: '%s' is not REPO=PACKAGE_DIR\n", argv[i]);
        return 2;
      }
      PackOptions o;
      o.repo = arg.substr(0, eq);
      o.package_dir = arg.substr(eq + 1);
      o.output = hub_dir;
      o.devices = {"cpu"};
      o.sign_key = &key;
      o.sign_hub_id = default_hub_statement_id(key.public_key());
      // The embedded hub lives and dies with its build tree: a freeze attack needs write access
      // to it, so its statements are long-lived.
      o.sign_expires = static_cast<int64_t>(std::time(nullptr)) + 10ll * 365 * 24 * 3600;
      if (!read_package_dir(o.package_dir).cuda_source.empty()) {
        o.devices = {"cuda", "cpu"};
        try {
          nvrtc();
        } catch (const Error& e) {
          std::fprintf(stderr, "make_default_hub: %s: no NVRTC, cuda variant with source only\n",
                       o.repo.c_str());
          o.sms.clear();
        }
      }
      PackReport r = pack_package(o);
      std::printf("default hub %s: %s@%s %s (%zu variant%s)\n", hub_dir.c_str(), o.repo.c_str(),
                  r.tags.front().c_str(), r.index.digest.str().c_str(), r.variants.size(),
                  r.variants.size() == 1 ? "" : "s");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_default_hub: %s\n", e.what());
    return 1;
  }
}
