// The OCI image layout transport: a hub directory written with push_blob/push_manifest, read
// back through the directory itself and through nginx serving the same directory.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/oci/oci.h"
#include "hub/transport/source.h"
#include "tests/fixtures/layout_builder.h"
#include "tests/fixtures/nginx_fixture.h"
#include "tests/fixtures/process.h"

namespace kh {
namespace {

namespace stdfs = std::filesystem;
using test::NginxFixture;
using test::TempDir;

constexpr const char* kRepo = "acme/rmsnorm";

std::string random_bytes(size_t n) {
  std::random_device rd;
  std::mt19937_64 gen(rd());
  std::string out(n, '\0');
  for (auto& c : out) c = static_cast<char>(gen() & 0xff);
  return out;
}

// Records what it is given, refuses bytes past the expected size; verified() is the final
// size + digest check a real store does before committing.
class MemorySink final : public BlobSink {
 public:
  explicit MemorySink(oci::Descriptor d) : desc_(std::move(d)) {}
  uint64_t offset() const override { return data.size(); }
  void write(const char* p, size_t n) override {
    if (data.size() + n > static_cast<uint64_t>(desc_.size)) {
      throw Error(ErrorKind::kIntegrity, "memory sink: more bytes than " + desc_.digest.str());
    }
    data.append(p, n);
  }
  void restart() override {
    data.clear();
    ++restarts;
  }
  bool verified() const {
    return static_cast<int64_t>(data.size()) == desc_.size && sha256_of(data) == desc_.digest;
  }
  std::string data;
  int restarts = 0;

 private:
  oci::Descriptor desc_;
};

SourceOptions fast_options() {
  SourceOptions o;
  o.http.max_attempts = 2;
  o.http.backoff_initial_s = 0.01;
  o.http.backoff_max_s = 0.05;
  o.http.connect_timeout_ms = 2000;
  return o;
}

std::unique_ptr<Source> open_dir(const stdfs::path& dir) {
  return open_layout_source(HubAddress::parse("file://" + dir.string(), false), fast_options());
}

ErrorKind kind_of(const std::function<void()>& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.kind();
  }
  ADD_FAILURE() << "expected a kh::Error";
  return ErrorKind::kIo;
}

void flip_byte(const stdfs::path& file, size_t at) {
  ::chmod(file.c_str(), 0644);  // blobs are written read-only
  std::string bytes = fs::read_file(file);
  ASSERT_LT(at, bytes.size());
  bytes[at] = static_cast<char>(bytes[at] ^ 0x5a);
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct PushedManifest {
  std::string bytes;
  oci::Descriptor desc;
};

// What the test pushed, to compare against what the transports serve.
struct Pushed {
  oci::Descriptor config = oci::empty_descriptor();
  std::vector<oci::Descriptor> layers;
  std::vector<std::string> layer_bytes;
  std::vector<PushedManifest> variants;
  PushedManifest index;
};

// An index of `variants` variant manifests, each with the empty config and one random layer,
// pushed blobs first and tagged with each of `tags`.
Pushed push_package(Source& src, const std::string& repo, const stdfs::path& scratch,
                    const std::vector<std::string>& tags, int variants = 2) {
  Pushed p;
  stdfs::path config_file = scratch / "config.json";
  fs::write_file_atomic(config_file, "{}");
  src.push_blob(repo, p.config, config_file);
  oci::Index index;
  index.artifact_type = oci::kArtifactTypeKernel;
  for (int v = 0; v < variants; ++v) {
    // Over one read chunk (1 MiB) so streaming takes several rounds.
    std::string layer = random_bytes((1 << 20) + 4096 + 1000 * static_cast<size_t>(v));
    oci::Descriptor ld = oci::describe(layer, oci::kMediaTypeLayerTarZstd);
    ld.annotations[std::string(oci::kAnnotationTitle)] = "package.tar.zst";
    stdfs::path layer_file = scratch / ("layer" + std::to_string(v) + ".bin." + fs::random_hex(6));
    fs::write_file_atomic(layer_file, layer);
    src.push_blob(repo, ld, layer_file);
    p.layers.push_back(ld);
    p.layer_bytes.push_back(layer);

    oci::Manifest m;
    m.artifact_type = oci::kArtifactTypeKernel;
    m.config = p.config;
    m.layers = {ld};
    std::string mbytes = oci::serialize(m);
    oci::Descriptor md = oci::describe(mbytes, oci::kMediaTypeManifest);
    md.artifact_type = oci::kArtifactTypeKernel;
    md.platform = oci::Platform{"linux", v == 0 ? "amd64" : "arm64", ""};
    md.annotations["kernelhub.device"] = "cuda";
    src.push_manifest(repo, md.digest.str(), mbytes, oci::kMediaTypeManifest);
    p.variants.push_back({mbytes, md});
    index.manifests.push_back(md);
  }
  p.index.bytes = oci::serialize(index);
  p.index.desc = oci::describe(p.index.bytes, oci::kMediaTypeIndex);
  for (auto& tag : tags) src.push_manifest(repo, tag, p.index.bytes, oci::kMediaTypeIndex);
  return p;
}

class LayoutHub : public ::testing::Test {
 protected:
  void SetUp() override {
    hub_ = std::make_unique<TempDir>("kh-layout-hub");
    scratch_ = std::make_unique<TempDir>("kh-layout-scratch");
    writer_ = open_dir(hub_->path());
    pushed_ = push_package(*writer_, kRepo, scratch_->path(), {"v1", "1.0.0"});
  }

  stdfs::path layout_dir() const { return hub_->path() / kRepo; }
  stdfs::path blob_file(const Digest& d) const { return layout_dir() / "blobs/sha256" / d.hex; }

  std::unique_ptr<TempDir> hub_, scratch_;
  std::unique_ptr<Source> writer_;
  Pushed pushed_;
};

// The same checks through both transports.
class LayoutTransport : public LayoutHub, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    LayoutHub::SetUp();
    if (GetParam() == "dir") {
      source_ = open_dir(hub_->path());
      return;
    }
    if (!NginxFixture::installed()) GTEST_SKIP() << "nginx is not installed";
    nginx_ = std::make_unique<NginxFixture>(hub_->path());
    source_ = open_layout_source(HubAddress::parse(nginx_->base_url(), false), fast_options());
  }
  void TearDown() override {
    if (HasFailure() && nginx_) std::cerr << "nginx error log:\n" << nginx_->error_log();
  }

  std::unique_ptr<NginxFixture> nginx_;
  std::unique_ptr<Source> source_;
};

TEST_P(LayoutTransport, GetsManifestByTagAndByDigest) {
  FetchedManifest by_tag = source_->get_manifest(kRepo, "v1");
  EXPECT_EQ(by_tag.bytes, pushed_.index.bytes);
  EXPECT_EQ(by_tag.media_type, oci::kMediaTypeIndex);
  EXPECT_EQ(by_tag.digest, pushed_.index.desc.digest);

  FetchedManifest by_digest = source_->get_manifest(kRepo, pushed_.index.desc.digest.str());
  EXPECT_EQ(by_digest.bytes, by_tag.bytes);
  EXPECT_EQ(by_digest.media_type, oci::kMediaTypeIndex);
  EXPECT_EQ(by_digest.digest, by_tag.digest);

  // Variant manifests are not index.json entries: found directly as blobs.
  for (auto& v : pushed_.variants) {
    FetchedManifest m = source_->get_manifest(kRepo, v.desc.digest.str());
    EXPECT_EQ(m.bytes, v.bytes);
    EXPECT_EQ(m.media_type, oci::kMediaTypeManifest);
    EXPECT_EQ(m.digest, v.desc.digest);
  }
  oci::Index index = oci::parse_index(by_tag.bytes);
  ASSERT_EQ(index.manifests.size(), 2u);
  EXPECT_EQ(index.manifests[1].platform->architecture, "arm64");
}

TEST_P(LayoutTransport, ListsTags) {
  EXPECT_EQ(source_->list_tags(kRepo), (std::vector<std::string>{"1.0.0", "v1"}));
}

TEST_P(LayoutTransport, FetchesBlobsIntoVerifyingSinks) {
  std::vector<std::unique_ptr<MemorySink>> sinks;
  std::vector<BlobFetch> fetches;
  auto add = [&](const oci::Descriptor& d) {
    sinks.push_back(std::make_unique<MemorySink>(d));
    BlobFetch f;
    f.desc = d;
    f.sink = sinks.back().get();
    fetches.push_back(f);
  };
  for (auto& l : pushed_.layers) add(l);
  oci::Descriptor config_by_transport = pushed_.config;
  config_by_transport.data.reset();  // fetched over the transport, not from inline data
  add(config_by_transport);
  add(pushed_.config);  // inline data: answered without a request
  // Resume: a sink that already holds a correct prefix gets only the rest.
  sinks.push_back(std::make_unique<MemorySink>(pushed_.layers[1]));
  sinks.back()->data = pushed_.layer_bytes[1].substr(0, 700000);
  BlobFetch resumed;
  resumed.desc = pushed_.layers[1];
  resumed.sink = sinks.back().get();
  fetches.push_back(resumed);

  source_->fetch_blobs(kRepo, fetches, nullptr);
  for (size_t i = 0; i < fetches.size(); ++i) {
    EXPECT_TRUE(fetches[i].ok) << i << ": " << fetches[i].error;
    EXPECT_TRUE(sinks[i]->verified()) << i;
  }
  EXPECT_EQ(sinks[0]->data, pushed_.layer_bytes[0]);
  EXPECT_EQ(sinks.back()->data, pushed_.layer_bytes[1]);
  EXPECT_EQ(sinks.back()->restarts, 0);
  if (nginx_) {
    // The resumed layer was asked for with Range and served partially.
    std::string log = nginx_->access_log();
    EXPECT_NE(log.find("/blobs/sha256/" + pushed_.layers[1].digest.hex + " HTTP/1.1\" 206"),
              std::string::npos)
        << log;
  }

  EXPECT_TRUE(source_->has_blob(kRepo, pushed_.layers[0]));
  EXPECT_TRUE(source_->has_blob(kRepo, pushed_.index.desc));
  oci::Descriptor absent = oci::describe("not pushed", oci::kMediaTypeOctetStream);
  EXPECT_FALSE(source_->has_blob(kRepo, absent));

  // A blob the layout does not have fails that blob only.
  MemorySink absent_sink(absent);
  std::vector<BlobFetch> missing(1);
  missing[0].desc = absent;
  missing[0].sink = &absent_sink;
  source_->fetch_blobs(kRepo, missing, nullptr);
  EXPECT_FALSE(missing[0].ok);
  EXPECT_NE(missing[0].error, "");
}

TEST_P(LayoutTransport, MissingTagOrRepoIsNotFoundAndNamesTheTags) {
  std::string msg;
  EXPECT_EQ(kind_of([&] { source_->get_manifest(kRepo, "v9"); }, &msg), ErrorKind::kNotFound);
  EXPECT_NE(msg.find("no tag 'v9'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tags present: 1.0.0, v1"), std::string::npos) << msg;
  EXPECT_NE(msg.find(kRepo), std::string::npos) << msg;

  EXPECT_EQ(kind_of([&] { source_->get_manifest("acme/absent", "v1"); }, &msg),
            ErrorKind::kNotFound);
  EXPECT_NE(msg.find("acme/absent"), std::string::npos) << msg;
  EXPECT_EQ(kind_of([&] { source_->list_tags("acme/absent"); }), ErrorKind::kNotFound);

  Digest unknown = sha256_of("nothing");
  EXPECT_EQ(kind_of([&] { source_->get_manifest(kRepo, unknown.str()); }), ErrorKind::kNotFound);
}

TEST_P(LayoutTransport, TamperedBlobsFailVerification) {
  flip_byte(blob_file(pushed_.index.desc.digest), 10);
  EXPECT_EQ(kind_of([&] { source_->get_manifest(kRepo, "v1"); }), ErrorKind::kIntegrity);
  EXPECT_EQ(kind_of([&] { source_->get_manifest(kRepo, pushed_.index.desc.digest.str()); }),
            ErrorKind::kIntegrity);
  flip_byte(blob_file(pushed_.variants[0].desc.digest), 3);
  EXPECT_EQ(kind_of([&] { source_->get_manifest(kRepo, pushed_.variants[0].desc.digest.str()); }),
            ErrorKind::kIntegrity);

  // Layers stream as served (same size, one byte off): the sink's check catches it.
  flip_byte(blob_file(pushed_.layers[0].digest), 123456);
  MemorySink sink(pushed_.layers[0]);
  std::vector<BlobFetch> fetches(1);
  fetches[0].desc = pushed_.layers[0];
  fetches[0].sink = &sink;
  source_->fetch_blobs(kRepo, fetches, nullptr);
  EXPECT_FALSE(fetches[0].ok && sink.verified());
  EXPECT_EQ(sink.data.size(), pushed_.layer_bytes[0].size());
  EXPECT_NE(sink.data, pushed_.layer_bytes[0]);

  // A blob that grew is refused before anything lands in the sink.
  stdfs::path grown = blob_file(pushed_.layers[1].digest);
  ::chmod(grown.c_str(), 0644);
  std::ofstream(grown, std::ios::app) << "extra";
  MemorySink sink2(pushed_.layers[1]);
  fetches[0].desc = pushed_.layers[1];
  fetches[0].sink = &sink2;
  source_->fetch_blobs(kRepo, fetches, nullptr);
  EXPECT_FALSE(fetches[0].ok);
  EXPECT_FALSE(sink2.verified());
}

TEST_P(LayoutTransport, RetaggingReplacesTheEntry) {
  Pushed second = push_package(*writer_, kRepo, scratch_->path(), {"v1"}, 1);
  FetchedManifest v1 = source_->get_manifest(kRepo, "v1");
  EXPECT_EQ(v1.bytes, second.index.bytes);
  EXPECT_EQ(source_->get_manifest(kRepo, "1.0.0").bytes, pushed_.index.bytes);
  EXPECT_EQ(source_->list_tags(kRepo), (std::vector<std::string>{"1.0.0", "v1"}));

  oci::Index index = oci::parse_index(fs::read_file(layout_dir() / "index.json"));
  int v1_entries = 0;
  for (auto& d : index.manifests) {
    if (d.annotations[std::string(oci::kAnnotationRefName)] == "v1") {
      ++v1_entries;
      EXPECT_EQ(d.digest, second.index.desc.digest);
    }
  }
  EXPECT_EQ(v1_entries, 1);
}

TEST_P(LayoutTransport, RefusesRepoNamesThatLeaveTheHub) {
  for (std::string bad : {"../etc", "acme/../../x", "acme/..", "/abs/path", "Acme/Upper", ""}) {
    EXPECT_EQ(kind_of([&] { source_->get_manifest(bad, "v1"); }), ErrorKind::kInvalidInput) << bad;
    EXPECT_EQ(kind_of([&] { source_->list_tags(bad); }), ErrorKind::kInvalidInput) << bad;
  }
  EXPECT_EQ(kind_of([&] { source_->get_manifest(kRepo, "../index"); }), ErrorKind::kInvalidInput);
}

INSTANTIATE_TEST_SUITE_P(Transports, LayoutTransport, ::testing::Values("dir", "nginx"),
                         [](const auto& info) { return info.param; });

// The directory written is a valid OCI image layout (image-spec image-layout.md).
TEST_F(LayoutHub, WritesAValidOciLayout) {
  EXPECT_EQ(fs::read_file(layout_dir() / "oci-layout"), R"({"imageLayoutVersion":"1.0.0"})");
  std::string index_bytes = fs::read_file(layout_dir() / "index.json");
  oci::Index index = oci::parse_index(index_bytes);
  ASSERT_EQ(index.manifests.size(), 2u);
  std::set<std::string> tags;
  for (auto& d : index.manifests) {
    EXPECT_EQ(d.media_type, oci::kMediaTypeIndex);
    EXPECT_EQ(d.digest, pushed_.index.desc.digest);
    EXPECT_EQ(d.size, pushed_.index.desc.size);
    EXPECT_EQ(d.artifact_type, oci::kArtifactTypeKernel);
    tags.insert(d.annotations[std::string(oci::kAnnotationRefName)]);
  }
  EXPECT_EQ(tags, (std::set<std::string>{"v1", "1.0.0"}));

  // Every file under blobs/sha256 hashes to its name; nothing else lives there.
  size_t blobs = 0;
  for (auto& e : stdfs::directory_iterator(layout_dir() / "blobs/sha256")) {
    ASSERT_TRUE(e.is_regular_file()) << e.path();
    EXPECT_EQ(sha256_of_file(e.path()).hex, e.path().filename().string()) << e.path();
    ++blobs;
  }
  // config + 2 layers + 2 variant manifests + index
  EXPECT_EQ(blobs, 6u);
  // Everything reachable from index.json is present with the right size.
  auto present = [&](const oci::Descriptor& d) {
    std::error_code ec;
    return static_cast<int64_t>(stdfs::file_size(blob_file(d.digest), ec)) == d.size && !ec;
  };
  for (auto& top : index.manifests) {
    ASSERT_TRUE(present(top));
    oci::Index x = oci::parse_index(fs::read_file(blob_file(top.digest)));
    for (auto& m : x.manifests) {
      ASSERT_TRUE(present(m));
      oci::Manifest man = oci::parse_manifest(fs::read_file(blob_file(m.digest)));
      EXPECT_TRUE(present(man.config));
      for (auto& l : man.layers) EXPECT_TRUE(present(l));
    }
  }
  // No temp files left behind anywhere in the layout.
  for (auto& e : stdfs::recursive_directory_iterator(layout_dir())) {
    EXPECT_NE(e.path().extension(), ".part") << "leftover temp " << e.path();
  }
}

TEST_F(LayoutHub, ConcurrentTaggersBothLand) {
  constexpr int kPerThread = 15;
  auto tagger = [&](const std::string& prefix) {
    auto src = open_dir(hub_->path());  // its own source, like another process
    for (int i = 0; i < kPerThread; ++i) {
      src->push_manifest(kRepo, prefix + std::to_string(i), pushed_.index.bytes,
                         oci::kMediaTypeIndex);
    }
  };
  std::thread a(tagger, "a");
  std::thread b(tagger, "b");
  a.join();
  b.join();
  std::vector<std::string> tags = writer_->list_tags(kRepo);
  EXPECT_EQ(tags.size(), 2u + 2 * kPerThread);
  for (int i = 0; i < kPerThread; ++i) {
    for (const char* p : {"a", "b"}) {
      std::string t = p + std::to_string(i);
      EXPECT_TRUE(std::find(tags.begin(), tags.end(), t) != tags.end()) << t;
    }
  }
  oci::parse_index(fs::read_file(layout_dir() / "index.json"));
}

TEST_F(LayoutHub, PushChecksItsInputs) {
  // Content that does not match its descriptor never becomes a blob.
  oci::Descriptor lie = oci::describe("the real content", oci::kMediaTypeOctetStream);
  stdfs::path f = scratch_->path() / "other";
  fs::write_file_atomic(f, "something else!!");
  EXPECT_EQ(kind_of([&] { writer_->push_blob(kRepo, lie, f); }), ErrorKind::kIntegrity);
  EXPECT_FALSE(stdfs::exists(blob_file(lie.digest)));

  // A manifest whose blobs are not there is refused (push order: blobs first).
  oci::Manifest m;
  m.artifact_type = oci::kArtifactTypeKernel;
  m.config = oci::empty_descriptor();
  m.layers = {oci::describe("never pushed", oci::kMediaTypeLayerTarZstd)};
  std::string bytes = oci::serialize(m);
  std::string msg;
  EXPECT_EQ(
      kind_of([&] { writer_->push_manifest(kRepo, "orphan", bytes, oci::kMediaTypeManifest); },
              &msg),
      ErrorKind::kNotFound);
  EXPECT_NE(msg.find(m.layers[0].digest.str()), std::string::npos) << msg;
  EXPECT_EQ(writer_->list_tags(kRepo), (std::vector<std::string>{"1.0.0", "v1"}));

  // A digest reference must match the bytes.
  EXPECT_EQ(kind_of([&] {
              writer_->push_manifest(kRepo, pushed_.layers[0].digest.str(), pushed_.index.bytes,
                                     oci::kMediaTypeIndex);
            }),
            ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] { writer_->push_blob("../escape", lie, f); }), ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] {
              writer_->push_manifest("a/../../b", "v1", pushed_.index.bytes, oci::kMediaTypeIndex);
            }),
            ErrorKind::kInvalidInput);

  // A damaged existing blob is replaced by a good push.
  flip_byte(blob_file(pushed_.layers[0].digest), 5);
  stdfs::path layer = scratch_->path() / "layer0";
  fs::write_file_atomic(layer, pushed_.layer_bytes[0]);
  writer_->push_blob(kRepo, pushed_.layers[0], layer);
  EXPECT_EQ(sha256_of_file(blob_file(pushed_.layers[0].digest)), pushed_.layers[0].digest);
}

TEST_F(LayoutHub, NeverFollowsLinksOutOfTheHub) {
  // A layout outside the hub, linked in as a repository.
  TempDir outside("kh-layout-outside");
  auto out_src = open_dir(outside.path());
  push_package(*out_src, "evil/pkg", scratch_->path(), {"v1"}, 1);
  stdfs::create_directories(hub_->path() / "evil");
  stdfs::create_directory_symlink(outside.path() / "evil/pkg", hub_->path() / "evil/pkg");
  auto src = open_dir(hub_->path());
  EXPECT_EQ(kind_of([&] { src->get_manifest("evil/pkg", "v1"); }), ErrorKind::kRefused);
  EXPECT_EQ(kind_of([&] { src->list_tags("evil/pkg"); }), ErrorKind::kRefused);
  stdfs::path cfg = scratch_->path() / "config.json";
  EXPECT_EQ(kind_of([&] { src->push_blob("evil/pkg", oci::empty_descriptor(), cfg); }),
            ErrorKind::kRefused);
}

TEST_F(LayoutHub, HttpLayoutsAreReadOnly) {
  // No server needed: pushes are refused before any request.
  auto src = open_layout_source(HubAddress::parse("http://127.0.0.1:9/hub", false), fast_options());
  std::string msg;
  EXPECT_EQ(
      kind_of([&] { src->push_blob(kRepo, pushed_.config, scratch_->path() / "config.json"); },
              &msg),
      ErrorKind::kUnsupported);
  EXPECT_NE(msg.find("read-only"), std::string::npos) << msg;
  EXPECT_EQ(
      kind_of([&] { src->push_manifest(kRepo, "v1", pushed_.index.bytes, oci::kMediaTypeIndex); }),
      ErrorKind::kUnsupported);
}

// A single layout written by another writer (the test layout builder) reads the same way.
TEST(SingleLayout, ReadsALayoutDirectory) {
  TempDir dir("kh-single-layout");
  test::LayoutSpec spec;
  spec.tag = "v3";
  test::BuiltLayout built = test::build_layout(dir.path(), spec);
  auto src = open_single_layout_source(dir.path(), fast_options());
  FetchedManifest m = src->get_manifest("ignored/repo", "v3");
  EXPECT_EQ(m.digest, built.index.digest);
  EXPECT_EQ(src->list_tags("whatever/name"), (std::vector<std::string>{"v3"}));
  std::vector<std::unique_ptr<MemorySink>> sinks;
  std::vector<BlobFetch> fetches;
  for (auto& l : built.layers) {
    sinks.push_back(std::make_unique<MemorySink>(l));
    BlobFetch f;
    f.desc = l;
    f.sink = sinks.back().get();
    fetches.push_back(f);
  }
  src->fetch_blobs("x/y", fetches, nullptr);
  for (size_t i = 0; i < fetches.size(); ++i) {
    EXPECT_TRUE(fetches[i].ok) << fetches[i].error;
    EXPECT_TRUE(sinks[i]->verified());
  }
}

}  // namespace
}  // namespace kh
