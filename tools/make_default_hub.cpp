// Builds the embedded default hub at build time: a layout hub directory holding
// kernel-hub/example (tags v1 and 1.0.0), packed from manifests/example-package/.
// Usage: make_default_hub HUB_DIR PACKAGE_DIR
// Reproducible: the same inputs give the same digests (the archive is reproducible and the
// documents are serialized canonically without timestamps).
#include <sys/utsname.h>

#include <cstdio>
#include <string>

#include "hub/archive.h"
#include "hub/error.h"
#include "hub/fs.h"
#include "hub/oci.h"
#include "hub/source.h"

namespace {

std::string host_architecture() {
  utsname u{};
  uname(&u);
  std::string m = u.machine;
  if (m == "x86_64") return "amd64";
  if (m == "aarch64") return "arm64";
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s HUB_DIR PACKAGE_DIR\n", argv[0]);
    return 2;
  }
  try {
    using namespace kh;
    const std::filesystem::path hub_dir = argv[1];
    const std::filesystem::path package_dir = argv[2];
    const std::string repo = "kernel-hub/example";
    fs::make_dirs(hub_dir);

    auto work = hub_dir.parent_path() / ".default-hub-work";
    fs::make_dirs(work);
    auto archive = work / "example.tar.zst";
    create_archive(package_dir, archive);
    std::string layer_bytes = fs::read_file(archive);

    oci::Descriptor layer = oci::describe(layer_bytes, oci::kMediaTypeLayerTarZstd);
    layer.annotations[std::string(oci::kAnnotationTitle)] = "example.tar.zst";
    oci::Manifest manifest;
    manifest.artifact_type = std::string(oci::kArtifactTypeKernel);
    manifest.config = oci::empty_descriptor();
    manifest.layers.push_back(layer);
    std::string manifest_bytes = oci::serialize(manifest);

    oci::Descriptor variant = oci::describe(manifest_bytes, oci::kMediaTypeManifest);
    variant.platform = oci::Platform{"linux", host_architecture(), ""};
    variant.annotations["kernelhub.device"] = "cpu";
    oci::Index index;
    index.manifests.push_back(variant);
    index.annotations[std::string(oci::kAnnotationVersion)] = "1.0.0";
    std::string index_bytes = oci::serialize(index);

    SourceOptions options;
    auto hub = open_source(HubAddress::parse(hub_dir.string(), false), options);
    hub->push_blob(repo, layer, archive);
    hub->push_manifest(repo, variant.digest.str(), manifest_bytes, oci::kMediaTypeManifest);
    for (const char* tag : {"1.0.0", "v1"}) {
      hub->push_manifest(repo, tag, index_bytes, oci::kMediaTypeIndex);
    }
    std::filesystem::remove_all(work);
    std::printf("default hub %s: %s@v1 %s\n", hub_dir.c_str(), repo.c_str(),
                oci::describe(index_bytes, oci::kMediaTypeIndex).digest.str().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_default_hub: %s\n", e.what());
    return 1;
  }
}
