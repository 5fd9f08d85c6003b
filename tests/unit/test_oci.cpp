#include <gtest/gtest.h>

#include "hub/base/error.h"
#include "hub/oci/oci.h"

namespace kh::oci {

namespace {
std::string hex(char c) {
  return std::string(64, c);
}

void expect_invalid(const std::string& doc, const std::string& needle, bool index = false) {
  try {
    if (index) {
      parse_index(doc);
    } else {
      parse_manifest(doc);
    }
    ADD_FAILURE() << "accepted: " << doc;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' lacks '" << needle << "'";
  }
}
}  // namespace

TEST(Oci, EmptyDescriptorMatchesSpec) {
  Descriptor d = empty_descriptor();
  EXPECT_EQ(d.digest.str(),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a");
  EXPECT_EQ(d.size, 2);
  EXPECT_EQ(*d.data, "e30=");
}

TEST(Oci, ManifestRoundTrip) {
  Manifest m;
  m.artifact_type = std::string(kArtifactTypeKernel);
  m.config = empty_descriptor();
  Descriptor layer = describe("payload", kMediaTypeLayerTarZstd);
  layer.annotations[std::string(kAnnotationTitle)] = "pkg.tar.zst";
  m.layers.push_back(layer);
  m.annotations["a"] = "b";
  std::string bytes = serialize(m);
  Manifest back = parse_manifest(bytes);
  EXPECT_EQ(back.artifact_type, m.artifact_type);
  EXPECT_EQ(back.config, m.config);
  ASSERT_EQ(back.layers.size(), 1u);
  EXPECT_EQ(back.layers[0], layer);
  EXPECT_EQ(serialize(back), bytes);  // canonical: stable bytes, stable digest
}

TEST(Oci, IndexRoundTripWithPlatform) {
  Index x;
  x.artifact_type = std::string(kArtifactTypeKernel);
  Descriptor d = describe("{\"m\":1}", kMediaTypeManifest);
  d.platform = Platform{"linux", "amd64", ""};
  d.annotations["kernelhub.device"] = "cuda";
  x.manifests.push_back(d);
  Index back = parse_index(serialize(x));
  ASSERT_EQ(back.manifests.size(), 1u);
  EXPECT_EQ(back.manifests[0], d);
  EXPECT_EQ(back.artifact_type, x.artifact_type);
}

TEST(Oci, ValidationErrorsNameThePath) {
  std::string cfg = R"({"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:)" +
                    hex('a') + R"(","size":2})";
  expect_invalid(R"({"schemaVersion":2,"config":)" + cfg +
                     R"(,"layers":[{"mediaType":"x/y","digest":"sha256:zz","size":1}]})",
                 "layers[0].digest");
  expect_invalid(R"({"schemaVersion":2,"config":)" + cfg +
                     R"(,"layers":[{"mediaType":"x/y","digest":"sha256:)" + hex('a') +
                     R"(","size":-1}]})",
                 "layers[0].size");
  expect_invalid(R"({"schemaVersion":2,"config":)" + cfg +
                     R"(,"layers":[{"mediaType":"not a type","digest":"sha256:)" + hex('a') +
                     R"(","size":1}]})",
                 "layers[0].mediaType");
  expect_invalid(R"({"schemaVersion":1,"config":)" + cfg + R"(,"layers":[]})", "schemaVersion");
  expect_invalid(R"({"schemaVersion":2,"layers":[]})", "config");
  expect_invalid("not json", "not valid JSON");
  expect_invalid(R"({"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",)"
                 R"("manifests":[]})",
                 "mediaType", /*index=*/true);
}

TEST(Oci, InlineDataIsVerified) {
  std::string doc = R"({"schemaVersion":2,"manifests":[{"mediaType":"a/b","digest":"sha256:)" +
                    hex('c') + R"(","size":2,"data":"e30="}]})";
  expect_invalid(doc, "inline data", /*index=*/true);
}

TEST(Oci, VerifyBytes) {
  Descriptor d = describe("abc", kMediaTypeOctetStream);
  EXPECT_NO_THROW(verify_bytes(d, "abc", "blob"));
  try {
    verify_bytes(d, "abd", "blob");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIntegrity);
  }
  EXPECT_THROW(verify_bytes(d, "abcd", "blob"), Error);
}

TEST(Oci, Base64) {
  for (std::string s : {"", "a", "ab", "abc", "abcd", "{}"}) {
    EXPECT_EQ(*base64_decode(base64_encode(s)), s);
  }
  EXPECT_FALSE(base64_decode("abc"));
  EXPECT_FALSE(base64_decode("ab!="));
}

}  // namespace kh::oci
