#include <gtest/gtest.h>

#include "hub/base/digest.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "tests/fixtures/process.h"

namespace kh {

TEST(Digest, KnownVectors) {
  EXPECT_EQ(sha256_of("").str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_of("{}").str(),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a");
}

TEST(Digest, StreamingEqualsOneShot) {
  std::string data(1 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 7919) >> 3);
  Sha256 h;
  for (size_t off = 0; off < data.size(); off += 4099) {
    h.update(data.data() + off, std::min<size_t>(4099, data.size() - off));
  }
  EXPECT_EQ(h.finish(), sha256_of(data));
}

TEST(Digest, FileDigest) {
  test::TempDir dir;
  fs::write_file_atomic(dir / "f", "hello");
  EXPECT_EQ(sha256_of_file(dir / "f"), sha256_of("hello"));
}

TEST(Digest, ParseRejectsBadSyntax) {
  EXPECT_THROW(Digest::parse("sha256:abc"), Error);
  EXPECT_THROW(Digest::parse("sha512:" + std::string(128, 'a')), Error);
  EXPECT_THROW(Digest::parse("sha256:" + std::string(64, 'A')), Error);  // uppercase
  EXPECT_THROW(Digest::parse(std::string(64, 'a')), Error);              // no algorithm
  EXPECT_NO_THROW(Digest::parse("sha256:" + std::string(64, 'a')));
  try {
    Digest::parse("md5:1234");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("md5:1234"), std::string::npos);
  }
}

}  // namespace kh
