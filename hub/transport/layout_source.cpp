// Layout hubs: one OCI image layout per repository at <base>/<org>/<name>/, read from a
// directory or a static HTTP base URL. All the OCI logic (index.json lookup, tags as ref.name
// annotations, verification) is written once in LayoutSource; the two transports only supply a
// HubReader: "bytes of a file by relative path, capped", "does it exist", and "stream files
// into sinks". Writing is directory-only: blobs first, index.json last by temp + rename, under
// an OFD lock so concurrent taggers do not lose each other's entries.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "hub/base/base64.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/oci/graph.h"
#include "hub/oci/ref.h"
#include "hub/transport/credentials.h"
#include "hub/transport/http.h"
#include "hub/transport/source.h"
#include "hub/trust/signature.h"

namespace kh {

namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;

constexpr size_t kChunkBytes = 1 << 20;
constexpr std::string_view kLockName = ".kernel-hub.lock";
constexpr std::string_view kOciLayoutFile = R"({"imageLayoutVersion":"1.0.0"})";

// One file to stream into a sink, by path relative to the reader's root.
struct StreamJob {
  std::string rel;
  uint64_t size = 0;
  BlobSink* sink = nullptr;
  bool ok = false;
  std::string error;
  bool integrity = false;  // the file is not the blob the descriptor names (BlobFetch::integrity)
};

// The transport under a layout hub.
class HubReader {
 public:
  virtual ~HubReader() = default;
  // The file's bytes, nullopt when it does not exist. Throws kRefused past `cap`.
  virtual std::optional<std::string> read(const std::string& rel, uint64_t cap) = 0;
  // Whether the file exists with exactly `size` bytes.
  virtual bool has(const std::string& rel, int64_t size) = 0;
  // Streams each file into its sink, resuming at the sink's offset. Sets ok/error per job.
  virtual void stream(std::vector<StreamJob>& jobs, Progress* progress) = 0;
  // Where a relative path lives (a path or a URL), for messages.
  virtual std::string where(const std::string& rel) const = 0;
};

// Both paths canonical: p is root or below it.
bool is_within(const stdfs::path& p, const stdfs::path& root) {
  auto root_end = std::mismatch(root.begin(), root.end(), p.begin(), p.end()).first;
  return root_end == root.end();
}

class DirReader final : public HubReader {
 public:
  explicit DirReader(stdfs::path root) : root_(std::move(root)) {}

  // The absolute path of rel, refused when it (through links) leaves the hub directory.
  stdfs::path resolve(const std::string& rel) const {
    std::error_code ec;
    stdfs::path real_root = stdfs::weakly_canonical(root_, ec);
    if (ec)
      throw Error(ErrorKind::kIo,
                  "cannot resolve hub directory " + root_.string() + ": " + ec.message());
    stdfs::path p = rel.empty() ? root_ : (root_ / rel).lexically_normal();
    stdfs::path real = stdfs::weakly_canonical(p, ec);
    if (ec) throw Error(ErrorKind::kIo, "cannot resolve " + p.string() + ": " + ec.message());
    if (!is_within(real, real_root)) {
      throw Error(ErrorKind::kRefused,
                  p.string() + " resolves to " + real.string() + ", outside the hub directory " +
                      root_.string() +
                      "; layout hubs never follow links out of their directory: replace the link "
                      "with the files");
    }
    return real;
  }

  std::optional<std::string> read(const std::string& rel, uint64_t cap) override {
    return fs::read_file_if_exists(resolve(rel), cap);
  }

  bool has(const std::string& rel, int64_t size) override {
    struct stat st {};
    if (::stat(resolve(rel).c_str(), &st) != 0) return false;
    return S_ISREG(st.st_mode) && st.st_size == size;
  }

  void stream(std::vector<StreamJob>& jobs, Progress* progress) override {
    // Local files: one after the other; the disk, not latency, is the limit.
    for (auto& job : jobs) {
      try {
        stream_one(job, progress);
      } catch (const std::exception& e) {
        job.ok = false;
        job.error = e.what();
      }
    }
  }

  std::string where(const std::string& rel) const override {
    return rel.empty() ? root_.string() : (root_ / rel).lexically_normal().string();
  }

 private:
  void stream_one(StreamJob& job, Progress* progress) {
    stdfs::path path = resolve(job.rel);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT || errno == ENOTDIR) {
        job.error = "blob file " + path.string() + " is missing: the layout is incomplete";
        return;
      }
      throw_errno("cannot open blob file " + path.string());
    }
    struct FdCloser {
      int fd;
      ~FdCloser() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw_errno("cannot stat " + path.string());
    if (static_cast<uint64_t>(st.st_size) != job.size) {
      job.error = "blob file " + path.string() + " is " + std::to_string(st.st_size) +
                  " bytes, the descriptor says " + std::to_string(job.size) +
                  ": the layout is damaged; re-publish it";
      job.integrity = true;
      return;
    }
    uint64_t offset = job.sink->offset();
    if (offset > job.size) {
      job.sink->restart();
      offset = 0;
    }
    if (progress) progress->add_total(job.size - offset);
    std::string buf(kChunkBytes, '\0');
    while (offset < job.size) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, job.size - offset));
      ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_errno("cannot read " + path.string());
      }
      if (n == 0) {
        job.error = "blob file " + path.string() + " shrank while being read";
        return;
      }
      job.sink->write(buf.data(), static_cast<size_t>(n));
      offset += static_cast<uint64_t>(n);
      if (progress) progress->advance(n);
    }
    job.ok = true;
  }

  stdfs::path root_;
};

class HttpReader final : public HubReader {
 public:
  HttpReader(std::string base_url, const SourceOptions& options)
      : base_url_(std::move(base_url)),
        options_(options),
        client_(with_plain_http(options.http, base_url_)) {}

  std::optional<std::string> read(const std::string& rel, uint64_t cap) override {
    http::Request req;
    req.url = where(rel);
    req.max_body = cap;
    http::Response res = send(req);
    if (res.status == 200) return std::move(res.body);
    if (res.status == 404 || res.status == 410) return std::nullopt;
    fail("GET", req.url, res);
  }

  bool has(const std::string& rel, int64_t size) override {
    http::Request req;
    req.method = "HEAD";
    req.url = where(rel);
    http::Response res = send(req);
    if (res.status == 404 || res.status == 410) return false;
    if (res.status != 200) fail("HEAD", req.url, res);
    std::string length = res.header("content-length");
    return length.empty() || length == std::to_string(size);
  }

  void stream(std::vector<StreamJob>& jobs, Progress* progress) override {
    std::vector<http::Download> downloads(jobs.size());
    const std::string auth = authorization();
    for (size_t i = 0; i < jobs.size(); ++i) {
      downloads[i].url = where(jobs[i].rel);
      downloads[i].expected_size = jobs[i].size;
      downloads[i].sink = jobs[i].sink;
      if (!auth.empty()) downloads[i].headers.push_back(auth);
    }
    client_.download(downloads, progress);
    for (size_t i = 0; i < jobs.size(); ++i) {
      jobs[i].ok = downloads[i].ok;
      jobs[i].integrity = downloads[i].integrity;
      if (downloads[i].ok) continue;
      if (downloads[i].status == 404 || downloads[i].status == 410) {
        jobs[i].error = "blob " + downloads[i].url + " is missing (HTTP " +
                        std::to_string(downloads[i].status) + "): the layout is incomplete";
      } else {
        jobs[i].error = downloads[i].error.empty() ? "GET " + downloads[i].url + " failed (HTTP " +
                                                         std::to_string(downloads[i].status) + ")"
                                                   : downloads[i].error;
      }
    }
  }

  std::string where(const std::string& rel) const override {
    return rel.empty() ? base_url_ : base_url_ + "/" + rel;
  }

 private:
  static http::Options with_plain_http(http::Options o, const std::string& base_url) {
    if (base_url.starts_with("http://")) o.allow_plain_http = true;
    return o;
  }

  // A static server behind HTTP Basic auth (nginx auth_basic, say): on its first 401, the
  // credentials the user has for its host[:port] (credentials file, containers' and docker's auth
  // files with their helpers, the scoped variables), then every request with them. The client
  // drops the header on a redirect to another origin (redirect.h).
  http::Response send(http::Request req) {
    if (std::string auth = authorization(); !auth.empty()) req.headers.push_back(auth);
    http::Response res = client_.send(req);
    if (res.status != 401 || !req.headers.empty()) return res;
    std::string auth;
    {
      std::lock_guard lock(auth_mu_);
      if (!credentials_loaded_) {
        credentials_ = load_credentials(options_, http::host_of(base_url_));
        credentials_loaded_ = true;
        if (credentials_ && !credentials_->username.empty())
          auth_ = "Authorization: Basic " +
                  base64_encode(credentials_->username + ":" + credentials_->password);
      }
      auth = auth_;
    }
    if (auth.empty()) return res;
    req.headers.push_back(auth);
    return client_.send(req);  // outside the lock: parallel requests stay parallel
  }

  std::string authorization() const {
    std::lock_guard lock(auth_mu_);
    return auth_;
  }

  [[noreturn]] void fail(const char* method, const std::string& url,
                         const http::Response& res) const {
    const long status = res.status;
    ErrorKind kind = (status == 401 || status == 403) ? ErrorKind::kAuth : ErrorKind::kNetwork;
    const std::string host = http::host_of(base_url_);
    std::string why =
        kind == ErrorKind::kAuth
            ? (authorization().empty()
                   ? "the server refuses access; if it wants a password, " + credentials_hint(host)
                   : "the server refuses the credentials for " + host + " from " +
                         credentials_->origin + "; check them, or the server's permissions")
        : status == 408 || status == 429 || status >= 500
            ? http::refusal_advice(client_.options(), status, res.attempts, res.waited_s)
            : "the static hub is not serving this file; check the server";
    throw Error(kind, std::string(method) + " " + url + " answered HTTP " + std::to_string(status) +
                          ": " + why);
  }

  std::string base_url_;
  SourceOptions options_;
  http::Client client_;
  mutable std::mutex auth_mu_;
  bool credentials_loaded_ = false;
  std::optional<Credentials> credentials_;
  std::string auth_;  // "Authorization: Basic ...", once the server asked and we have some
};

std::string blob_rel(const Digest& d) {
  return "blobs/sha256/" + d.hex;
}

std::string join_tags(const std::vector<std::string>& tags) {
  if (tags.empty()) return "none";
  std::string out;
  for (auto& t : tags) out += (out.empty() ? "" : ", ") + t;
  return out;
}

std::string ref_name(const oci::Descriptor& d) {
  auto it = d.annotations.find(std::string(oci::kAnnotationRefName));
  return it == d.annotations.end() ? std::string() : it->second;
}

// The media type a document declares, or what its shape says when mediaType is absent.
std::string document_media_type(std::string_view bytes) {
  std::string mt = oci::peek_media_type(bytes);
  if (!mt.empty()) return mt;
  json j = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("manifests")) return std::string(oci::kMediaTypeIndex);
  if (j.is_object() && j.contains("layers")) return std::string(oci::kMediaTypeManifest);
  return {};
}

class LayoutSource final : public Source {
 public:
  // single_layout: the root is itself one layout and the repo argument is ignored.
  LayoutSource(HubAddress address, std::unique_ptr<HubReader> reader, DirReader* dir,
               bool single_layout)
      : address_(std::move(address)),
        reader_(std::move(reader)),
        dir_(dir),
        single_layout_(single_layout) {}

  const HubAddress& address() const override { return address_; }

  FetchedManifest get_manifest(const std::string& repo, const std::string& reference) override {
    std::string base = layout_rel(repo);
    oci::Index index = read_index(repo, base);
    std::optional<oci::Descriptor> found;
    if (reference.starts_with("sha256:")) {
      Digest digest = Digest::parse(reference);
      for (auto& d : index.manifests) {
        if (d.digest == digest) found = d;
      }
      if (!found) return get_manifest_blob(repo, base, digest);
    } else {
      if (!is_valid_tag(reference)) {
        throw Error(ErrorKind::kInvalidInput,
                    "invalid tag '" + reference +
                        "': tags are [a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}, digests sha256:<64 hex>");
      }
      for (auto& d : index.manifests) {
        if (ref_name(d) == reference) found = d;  // the last matching entry wins
      }
      if (!found) {
        throw Error(ErrorKind::kNotFound, label(repo) + ": no tag '" + reference + "' in layout " +
                                              reader_->where(base) +
                                              "; tags present: " + join_tags(tags_of(index)));
      }
    }
    if (found->size < 0 || static_cast<uint64_t>(found->size) > oci::kMaxManifestBytes) {
      throw Error(ErrorKind::kRefused,
                  label(repo) + "@" + reference + ": manifest " + found->digest.str() + " is " +
                      std::to_string(found->size) + " bytes, over the limit of " +
                      std::to_string(oci::kMaxManifestBytes) + " for metadata documents");
    }
    std::string rel = base + blob_rel(found->digest);
    auto bytes = reader_->read(rel, oci::kMaxManifestBytes);
    if (!bytes) {
      throw Error(ErrorKind::kNotFound, label(repo) + "@" + reference + ": index.json names " +
                                            found->digest.str() + " but " + reader_->where(rel) +
                                            " is missing; the layout is incomplete: re-publish it");
    }
    oci::verify_bytes(*found, *bytes, reader_->where(rel));
    return FetchedManifest{std::move(*bytes), found->media_type, found->digest};
  }

  void fetch_blobs(const std::string& repo, std::vector<BlobFetch>& blobs,
                   Progress* progress) override {
    std::string base = layout_rel(repo);
    std::vector<StreamJob> jobs;
    std::vector<size_t> job_of;  // index into blobs
    for (size_t i = 0; i < blobs.size(); ++i) {
      BlobFetch& b = blobs[i];
      b.ok = false;
      b.error.clear();
      if (b.desc.size < 0) {
        b.error = "descriptor of " + b.desc.digest.str() + " has a negative size";
        continue;
      }
      if (b.desc.data) {
        write_inline(b);
        continue;
      }
      StreamJob job;
      job.rel = base + blob_rel(b.desc.digest);
      job.size = static_cast<uint64_t>(b.desc.size);
      job.sink = b.sink;
      jobs.push_back(std::move(job));
      job_of.push_back(i);
    }
    if (!jobs.empty()) reader_->stream(jobs, progress);
    for (size_t j = 0; j < jobs.size(); ++j) {
      blobs[job_of[j]].ok = jobs[j].ok;
      blobs[job_of[j]].error = jobs[j].error;
      blobs[job_of[j]].integrity = jobs[j].integrity;
    }
  }

  bool has_blob(const std::string& repo, const oci::Descriptor& desc) override {
    return reader_->has(layout_rel(repo) + blob_rel(desc.digest), desc.size);
  }

  void push_blob(const std::string& repo, const oci::Descriptor& desc,
                 const stdfs::path& file) override {
    stdfs::path layout = prepare_layout(repo);
    store_blob(layout, desc, file.string(), [&](fs::TempFile& tmp, Sha256& hash) {
      int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw_errno("cannot open " + file.string() + " to push it");
      struct FdCloser {
        int fd;
        ~FdCloser() { ::close(fd); }
      } closer{fd};
      std::string buf(kChunkBytes, '\0');
      for (;;) {
        ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n < 0) {
          if (errno == EINTR) continue;
          throw_errno("cannot read " + file.string());
        }
        if (n == 0) break;
        hash.update(buf.data(), static_cast<size_t>(n));
        tmp.write(buf.data(), static_cast<size_t>(n));
        if (tmp.size() > static_cast<uint64_t>(desc.size)) break;  // reported by the check
      }
    });
  }

  void push_manifest(const std::string& repo, const std::string& reference, std::string_view bytes,
                     std::string_view media_type) override {
    require_writable();
    std::string what = label(repo) + "@" + reference;
    if (bytes.size() > oci::kMaxManifestBytes) {
      throw Error(ErrorKind::kRefused,
                  "push " + what + ": manifest is " + std::to_string(bytes.size()) +
                      " bytes, over the limit of " + std::to_string(oci::kMaxManifestBytes));
    }
    Digest digest = sha256_of(bytes);
    bool by_digest = reference.starts_with("sha256:");
    if (by_digest) {
      if (Digest::parse(reference) != digest) {
        throw Error(ErrorKind::kInvalidInput, "push " + what + ": the manifest bytes hash to " +
                                                  digest.str() + ", not to the reference");
      }
    } else if (!is_valid_tag(reference)) {
      throw Error(ErrorKind::kInvalidInput,
                  "push " + what + ": '" + reference +
                      "' is not a valid tag ([a-zA-Z0-9_][a-zA-Z0-9._-]{0,127})");
    }
    std::string declared = document_media_type(bytes);
    std::string mt = media_type.empty() ? declared : std::string(media_type);
    if (!declared.empty() && declared != mt) {
      throw Error(ErrorKind::kInvalidInput, "push " + what + ": media type '" + mt +
                                                "' given, but the document declares '" + declared +
                                                "'");
    }
    if (mt != oci::kMediaTypeIndex && mt != oci::kMediaTypeManifest) {
      throw Error(ErrorKind::kUnsupported, "push " + what + ": media type '" + mt +
                                               "' is not an OCI image manifest or index");
    }
    oci::Document doc = oci::parse_document(bytes, oci::document_kind(mt), what);

    stdfs::path layout = prepare_layout(repo);
    // Like a registry's MANIFEST_BLOB_UNKNOWN: everything referenced must already be there,
    // so a reader never sees a manifest it cannot follow. Inline data is written out here.
    for (auto& [kind, child] : doc.children) {
      if (dir_->has(layout_rel(repo) + blob_rel(child.digest), child.size)) continue;
      if (child.data) {
        auto decoded = base64_decode(*child.data);
        if (!decoded) {
          throw Error(ErrorKind::kInvalidInput,
                      "push " + what + ": inline data of " + child.digest.str() + " is not base64");
        }
        store_bytes(layout, child, *decoded, what);
        continue;
      }
      throw Error(ErrorKind::kNotFound,
                  "push " + what + ": it references " + child.digest.str() + " (" +
                      child.media_type + "), which is not in " + layout.string() +
                      "; push blobs and variant manifests before the manifest that names them");
    }

    oci::Descriptor self;
    self.media_type = mt;
    self.digest = digest;
    self.size = static_cast<int64_t>(bytes.size());
    store_bytes(layout, self, bytes, what);
    if (by_digest) {
      ensure_index(layout);
      return;
    }
    self.artifact_type = doc.artifact_type;
    self.annotations[std::string(oci::kAnnotationRefName)] = reference;
    set_tag(layout, reference, self);
  }

  std::vector<std::string> list_tags(const std::string& repo) override {
    return tags_of(read_index(repo, layout_rel(repo)));
  }

  trust::SignatureSet get_signatures(const std::string& repo,
                                     const oci::Descriptor& index) override {
    std::string rel = layout_rel(repo) + signature_sidecar_rel(index.digest);
    auto bytes = reader_->read(rel, trust::kMaxSignatureSetBytes);
    if (!bytes) return {};
    try {
      return trust::SignatureSet::parse(*bytes, reader_->where(rel));
    } catch (const Error&) {
      return {};  // a damaged sidecar verifies nothing; the index then counts as unsigned
    }
  }

  void push_signature(const std::string& repo, const oci::Descriptor& index,
                      const trust::Envelope& envelope) override {
    stdfs::path layout = prepare_layout(repo);
    if (!dir_->has(layout_rel(repo) + blob_rel(index.digest), index.size))
      throw Error(ErrorKind::kNotFound, label(repo) + ": cannot sign " + index.digest.str() +
                                            ": the layout does not hold that index; push it first");
    fs::FileLock lock = fs::FileLock::acquire(layout / kLockName);
    stdfs::path path = layout / signature_sidecar_rel(index.digest);
    trust::SignatureSet set;
    if (auto bytes = fs::read_file_if_exists(path, trust::kMaxSignatureSetBytes))
      set = trust::SignatureSet::parse(*bytes, path.string());
    set.add(envelope);
    fs::make_dirs(path.parent_path());
    fs::write_file_atomic(path, set.serialize(), 0644);
  }

 private:
  std::string label(const std::string& repo) const {
    return single_layout_ ? reader_->where("") : repo;
  }

  // Relative path of the repository's layout ("org/name/"), validated.
  std::string layout_rel(const std::string& repo) const {
    if (single_layout_) return "";
    if (!is_valid_repo_name(repo)) {
      throw Error(ErrorKind::kInvalidInput,
                  "invalid repository name '" + repo +
                      "': use lowercase letters, digits and '.', '_', '-' separators, parts "
                      "joined by '/' (e.g. org/name)");
    }
    return repo + "/";
  }

  oci::Index read_index(const std::string& repo, const std::string& base) {
    std::string rel = base + "index.json";
    auto bytes = reader_->read(rel, oci::kMaxManifestBytes);
    if (!bytes) {
      // The hub directory itself missing is a wrong --hub, not a missing repository.
      std::error_code ec;
      if (single_layout_)
        throw Error(ErrorKind::kInvalidInput,
                    reader_->where("") +
                        " is not an OCI image layout (it has no index.json); give the layout "
                        "`kernel-hub pack -o` wrote");
      if (dir_ && !stdfs::is_directory(reader_->where(""), ec))
        throw Error(ErrorKind::kInvalidInput,
                    "the hub directory " + reader_->where("") +
                        " does not exist or is not a directory; check --hub (or "
                        "KERNEL_HUB_ENDPOINT): a hub directory holds <org>/<name>/ OCI layouts");
      throw Error(ErrorKind::kNotFound, label(repo) + ": no such repository in layout hub " +
                                            reader_->where("") + " (" + reader_->where(rel) +
                                            " does not exist); check the name and the hub");
    }
    return oci::parse_index(*bytes, reader_->where(rel));
  }

  static std::vector<std::string> tags_of(const oci::Index& index) {
    std::set<std::string> tags;
    for (auto& d : index.manifests) {
      std::string t = ref_name(d);
      if (!t.empty()) tags.insert(t);
    }
    return {tags.begin(), tags.end()};
  }

  FetchedManifest get_manifest_blob(const std::string& repo, const std::string& base,
                                    const Digest& digest) {
    // Not an index.json entry, but maybe a manifest reachable from one (a variant).
    std::string rel = base + blob_rel(digest);
    auto bytes = reader_->read(rel, oci::kMaxManifestBytes);
    if (!bytes) {
      throw Error(ErrorKind::kNotFound, label(repo) + ": no manifest " + digest.str() +
                                            " in layout " + reader_->where(base));
    }
    Digest got = sha256_of(*bytes);
    if (got != digest) {
      throw Error(ErrorKind::kIntegrity, reader_->where(rel) + ": digest mismatch: expected " +
                                             digest.str() + ", got " + got.str() +
                                             "; the layout is damaged: re-publish it");
    }
    std::string mt = document_media_type(*bytes);
    if (mt != oci::kMediaTypeIndex && mt != oci::kMediaTypeManifest) {
      throw Error(ErrorKind::kUnsupported, reader_->where(rel) + " (" + digest.str() +
                                               ") is not an OCI image manifest or index");
    }
    return FetchedManifest{std::move(*bytes), mt, digest};
  }

  void write_inline(BlobFetch& b) {
    try {
      auto decoded = base64_decode(*b.desc.data);
      if (!decoded) {
        b.error = "inline data of " + b.desc.digest.str() + " is not base64";
        return;
      }
      if (b.sink->offset() != 0) b.sink->restart();
      b.sink->write(decoded->data(), decoded->size());
      b.ok = true;
    } catch (const std::exception& e) {
      b.error = e.what();
    }
  }

  void require_writable() const {
    if (dir_ == nullptr) {
      throw Error(ErrorKind::kUnsupported,
                  "static HTTP hubs are read-only (" + address_.text +
                      "); push to the directory the server publishes (file://...) or to an "
                      "oci:// registry");
    }
  }

  // Creates the layout directory (and its oci-layout file) and returns its real path.
  stdfs::path prepare_layout(const std::string& repo) {
    require_writable();
    std::string base = layout_rel(repo);
    stdfs::path layout = dir_->resolve(base);
    fs::make_dirs(layout / "blobs" / "sha256");
    layout = dir_->resolve(base);  // again: a link may have appeared on the way
    if (!stdfs::exists(layout / "oci-layout")) {
      fs::write_file_atomic(layout / "oci-layout", kOciLayoutFile, 0644);
    }
    return layout;
  }

  using Filler = std::function<void(fs::TempFile&, Sha256&)>;

  // Writes blobs/sha256/<hex> from `fill`, checking size and digest before it becomes visible.
  // An intact existing copy is kept; a damaged one is replaced.
  void store_blob(const stdfs::path& layout, const oci::Descriptor& desc, const std::string& what,
                  const Filler& fill) {
    stdfs::path dest = layout / "blobs" / "sha256" / desc.digest.hex;
    bool replace = false;
    std::error_code ec;
    if (stdfs::is_regular_file(dest, ec)) {
      if (static_cast<int64_t>(stdfs::file_size(dest, ec)) == desc.size && !ec &&
          sha256_of_file(dest) == desc.digest) {
        return;
      }
      replace = true;
    }
    // Temps live beside blobs/sha256/, not in it, so the algorithm directory only ever holds
    // complete, verified blobs.
    fs::TempFile tmp(layout / "blobs", ".tmp-" + desc.digest.hex);
    Sha256 hash;
    fill(tmp, hash);
    Digest got = hash.finish();
    if (static_cast<int64_t>(tmp.size()) != desc.size || got != desc.digest) {
      throw Error(ErrorKind::kIntegrity,
                  "push " + what + ": content is " + got.str() + " (" + std::to_string(tmp.size()) +
                      " bytes) but the descriptor says " + desc.digest.str() + " (" +
                      std::to_string(desc.size) +
                      " bytes); the input changed since it was described: pack it again");
    }
    tmp.commit(dest, 0444, /*keep_existing=*/!replace);
  }

  void store_bytes(const stdfs::path& layout, const oci::Descriptor& desc, std::string_view bytes,
                   const std::string& what) {
    store_blob(layout, desc, what, [&](fs::TempFile& tmp, Sha256& hash) {
      hash.update(bytes);
      tmp.write(bytes);
    });
  }

  // Reads index.json as JSON (keeping fields written by other tools), validated.
  static json load_index_json(const stdfs::path& layout) {
    stdfs::path path = layout / "index.json";
    auto bytes = fs::read_file_if_exists(path, oci::kMaxManifestBytes);
    if (!bytes) {
      return json{{"schemaVersion", 2},
                  {"mediaType", std::string(oci::kMediaTypeIndex)},
                  {"manifests", json::array()}};
    }
    oci::parse_index(*bytes, path.string());  // refuses a broken index before we touch it
    return json::parse(*bytes);
  }

  static void ensure_index(const stdfs::path& layout) {
    if (stdfs::exists(layout / "index.json")) return;
    fs::FileLock lock = fs::FileLock::acquire(layout / kLockName);
    if (stdfs::exists(layout / "index.json")) return;
    fs::write_file_atomic(layout / "index.json", load_index_json(layout).dump(), 0644);
  }

  // Replaces (or adds) the index.json entry for `tag`. The lock serializes read-modify-write
  // cycles of concurrent publishers; readers never lock, they see the old or the new file.
  static void set_tag(const stdfs::path& layout, const std::string& tag,
                      const oci::Descriptor& entry) {
    fs::FileLock lock = fs::FileLock::acquire(layout / kLockName);
    json index = load_index_json(layout);
    json kept = json::array();
    for (auto& e : index["manifests"]) {
      auto ann = e.find("annotations");
      bool same_tag = ann != e.end() && ann->is_object() &&
                      ann->value(std::string(oci::kAnnotationRefName), std::string()) == tag;
      if (!same_tag) kept.push_back(e);
    }
    kept.push_back(json::parse(oci::serialize(entry)));
    index["manifests"] = std::move(kept);
    fs::write_file_atomic(layout / "index.json", index.dump(), 0644);
  }

  HubAddress address_;
  std::unique_ptr<HubReader> reader_;
  DirReader* dir_;  // the same object as reader_ for directories; null for HTTP
  bool single_layout_;
};

}  // namespace

std::unique_ptr<Source> open_layout_source(const HubAddress& address,
                                           const SourceOptions& options) {
  switch (address.kind) {
    case HubAddress::Kind::kDirLayout: {
      auto reader = std::make_unique<DirReader>(address.dir);
      DirReader* dir = reader.get();
      return std::make_unique<LayoutSource>(address, std::move(reader), dir, false);
    }
    case HubAddress::Kind::kHttpLayout:
      return std::make_unique<LayoutSource>(
          address, std::make_unique<HttpReader>(address.base_url, options), nullptr, false);
    case HubAddress::Kind::kRegistry:
      break;
  }
  throw Error(ErrorKind::kInvalidInput, "hub address '" + address.text +
                                            "' is a registry, not a layout hub; use "
                                            "open_registry_source");
}

std::unique_ptr<Source> open_single_layout_source(const stdfs::path& layout_dir,
                                                  const SourceOptions& options) {
  (void)options;  // a local directory: no transport settings apply
  HubAddress address;
  address.kind = HubAddress::Kind::kDirLayout;
  address.text = layout_dir.string();
  address.dir = stdfs::absolute(layout_dir).lexically_normal();
  auto reader = std::make_unique<DirReader>(address.dir);
  DirReader* dir = reader.get();
  return std::make_unique<LayoutSource>(address, std::move(reader), dir, true);
}

}  // namespace kh
