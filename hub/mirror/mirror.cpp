#include "hub/mirror/mirror.h"
#include "hub/base/clock.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/oci/graph.h"
#include "hub/oci/oci.h"
#include "hub/oci/ref.h"
#include "hub/transport/source.h"
#include "hub/trust/signature.h"

namespace kh::mirror {

namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;

constexpr std::string_view kOciLayoutFile = R"({"imageLayoutVersion":"1.0.0"})";
constexpr uint64_t kMaxMirrorFileBytes = 16 << 20;

void say(const NoteFn& note, const std::string& line) {
  if (note) note(line);
}

// Keeps a warning in the report (export or import) and says it.
template <typename Report>
void warn(Report& report, const NoteFn& note, const std::string& w) {
  report.warnings.push_back(w);
  say(note, "warning: " + w);
}

std::string ref_name(const oci::Descriptor& d) {
  auto it = d.annotations.find(std::string(oci::kAnnotationRefName));
  return it == d.annotations.end() ? std::string() : it->second;
}

// An absolute, normal path without a trailing separator.
stdfs::path clean_dir(const stdfs::path& dir) {
  stdfs::path p = stdfs::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

// Copies a cached blob into a layout's blobs/sha256/, re-hashing it on the way (a damaged cache
// entry never reaches a mirror). Returns false when the layout already had it.
bool copy_blob(const Store& store, const oci::Descriptor& desc, const stdfs::path& layout,
               const std::string& what) {
  stdfs::path dest = layout / "blobs" / "sha256" / desc.digest.hex;
  std::error_code ec;
  if (stdfs::exists(dest, ec)) return false;
  fs::TempFile tmp(layout / "blobs", ".tmp-" + desc.digest.hex);
  Sha256 hash;
  if (!store.has_blob(desc.digest)) {
    std::optional<std::string> inline_bytes;
    if (desc.data) inline_bytes = base64_decode(*desc.data);
    if (!inline_bytes)
      throw Error(ErrorKind::kNotFound,
                  fmt::format("export: {}: blob {} is not in the cache {}; pull it first (the "
                              "export reads the cache only)",
                              what, desc.digest.str(), store.root().string()));
    hash.update(*inline_bytes);
    tmp.write(*inline_bytes);
  } else {
    fs::for_each_chunk(store.blob_path(desc.digest), [&](const char* data, size_t n) {
      hash.update(data, n);
      tmp.write(data, n);
    });
  }
  Digest got = hash.finish();
  if (got != desc.digest || static_cast<int64_t>(tmp.size()) != desc.size) {
    throw Error(ErrorKind::kIntegrity,
                fmt::format("export: {}: the cached blob {} is damaged (it hashes to {}, {} "
                            "bytes, expected {} bytes); run `kernel-hub verify` and pull again",
                            what, desc.digest.str(), got.str(), tmp.size(), desc.size));
  }
  tmp.commit(dest, 0444);
  return true;
}

// Reads a cached metadata document (index or manifest), verified against its digest.
std::string cached_document(const Store& store, const Digest& digest, const std::string& what) {
  auto bytes = store.read_blob(digest, oci::kMaxManifestBytes);
  if (!bytes)
    throw Error(ErrorKind::kNotFound,
                fmt::format("export: {}: {} is not in the cache {}; pull it first", what,
                            digest.str(), store.root().string()));
  return std::move(*bytes);
}

// Replaces `dir` by `tmp` (a complete mirror): rename over a missing or empty dir, an atomic
// exchange with an existing mirror (the old tree is then removed).
void install_dir(const stdfs::path& tmp, const stdfs::path& dir, bool replacing) {
  if (!replacing) {
    if (::rename(tmp.c_str(), dir.c_str()) != 0)
      throw_errno("export: cannot rename " + tmp.string() + " to " + dir.string());
  } else {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
      if (errno != EINVAL && errno != ENOSYS)
        throw_errno("export: cannot exchange " + tmp.string() + " with " + dir.string());
      // No RENAME_EXCHANGE on this file system: move the old mirror aside, then ours in.
      stdfs::path old = tmp;
      old += ".old";
      if (::rename(dir.c_str(), old.c_str()) != 0)
        throw_errno("export: cannot move the old mirror " + dir.string() + " aside");
      if (::rename(tmp.c_str(), dir.c_str()) != 0) {
        int saved = errno;
        ::rename(old.c_str(), dir.c_str());
        errno = saved;
        throw_errno("export: cannot rename " + tmp.string() + " to " + dir.string());
      }
      fs::remove_tree(old);
    } else {
      fs::remove_tree(tmp);  // the old mirror, exchanged into tmp's name
    }
  }
  fs::fsync_dir(dir.parent_path());
}

}  // namespace

std::string MirrorRef::str() const {
  return repo + "@" + (tag.empty() ? index.str() : tag);
}

bool is_valid_hub_id_path(std::string_view text) {
  if (text.empty() || text.size() > 512) return false;
  if (!(text.starts_with("registry/") || text.starts_with("http/") || text.starts_with("dir/")))
    return false;
  size_t start = 0;
  while (start <= text.size()) {
    size_t slash = text.find('/', start);
    if (slash == std::string_view::npos) slash = text.size();
    std::string_view part = text.substr(start, slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    for (char c : part) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '-' || c == '_';
      if (!ok) return false;
    }
    start = slash + 1;
  }
  return true;
}

std::string MirrorInfo::serialize() const {
  json refs_json = json::array();
  for (auto& r : refs) {
    json variants = json::array();
    for (auto& v : r.variants) variants.push_back(v.str());
    json j = {{"repo", r.repo},
              {"index_digest", r.index.str()},
              {"resolved_at", r.resolved_at},
              {"all_variants", r.all_variants},
              {"variants", variants}};
    if (!r.tag.empty()) j["tag"] = r.tag;
    refs_json.push_back(std::move(j));
  }
  json j = {{"format", format},
            {"source_hub_id", source_hub_id},
            {"source", source},
            {"created", created},
            {"refs", refs_json}};
  return j.dump(2) + "\n";
}

MirrorInfo MirrorInfo::parse(std::string_view text, const std::string& what) {
  auto bad = [&](const std::string& why) -> Error {
    return Error(ErrorKind::kInvalidInput, what + ": " + why);
  };
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
  MirrorInfo info;
  if (!j.contains("format") || !j["format"].is_number_integer() || j["format"] != kMirrorFormat)
    throw bad(fmt::format("\"format\" must be {} (made by a newer kernel-hub?)", kMirrorFormat));
  if (!j.contains("source_hub_id") || !j["source_hub_id"].is_string() ||
      !is_valid_hub_id_path(j["source_hub_id"].get<std::string>()))
    throw bad("\"source_hub_id\" must be a hub id such as registry/HOST_PORT or dir/PATH");
  info.source_hub_id = j["source_hub_id"];
  if (j.contains("source") && j["source"].is_string()) info.source = j["source"];
  if (j.contains("created") && j["created"].is_number_integer()) info.created = j["created"];
  if (!j.contains("refs") || !j["refs"].is_array()) throw bad("\"refs\" must be an array");
  for (size_t i = 0; i < j["refs"].size(); ++i) {
    const json& r = j["refs"][i];
    std::string at = fmt::format("refs[{}]", i);
    if (!r.is_object()) throw bad(at + " is not an object");
    MirrorRef ref;
    if (!r.contains("repo") || !r["repo"].is_string() ||
        !is_valid_repo_name(r["repo"].get<std::string>()))
      throw bad(at + ".repo is not a valid repository name");
    ref.repo = r["repo"];
    if (r.contains("tag")) {
      if (!r["tag"].is_string() || !is_valid_tag(r["tag"].get<std::string>()))
        throw bad(at + ".tag is not a valid tag");
      ref.tag = r["tag"];
    }
    if (!r.contains("index_digest") || !r["index_digest"].is_string() ||
        !Digest::is_valid(r["index_digest"].get<std::string>()))
      throw bad(at + ".index_digest is not a sha256 digest");
    ref.index = Digest::parse(r["index_digest"].get<std::string>());
    if (r.contains("resolved_at") && r["resolved_at"].is_number_integer())
      ref.resolved_at = r["resolved_at"];
    if (r.contains("all_variants") && r["all_variants"].is_boolean())
      ref.all_variants = r["all_variants"];
    if (r.contains("variants")) {
      if (!r["variants"].is_array()) throw bad(at + ".variants is not an array");
      for (auto& v : r["variants"]) {
        if (!v.is_string() || !Digest::is_valid(v.get<std::string>()))
          throw bad(at + ".variants holds something other than a sha256 digest");
        ref.variants.insert(Digest::parse(v.get<std::string>()));
      }
    }
    info.refs.push_back(std::move(ref));
  }
  return info;
}

// --- export ---

bool check_output_dir(const stdfs::path& dir_in, bool force) {
  const stdfs::path dir = clean_dir(dir_in);
  bool replacing = false;
  std::error_code ec;
  auto st = stdfs::symlink_status(dir, ec);
  if (stdfs::exists(st)) {
    if (!stdfs::is_directory(st))
      throw Error(ErrorKind::kInvalidInput,
                  "export: " + dir.string() + " exists and is not a directory; choose another -o");
    if (!stdfs::is_empty(dir, ec)) {
      if (!force)
        throw Error(ErrorKind::kInvalidInput,
                    "export: " + dir.string() +
                        " exists and is not empty; choose a new directory, or pass --force to "
                        "replace an earlier mirror there");
      if (!stdfs::is_regular_file(dir / kMirrorFile, ec))
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("export: {} is not a kernel-hub mirror (no {}); --force only "
                                "replaces mirrors: remove the directory yourself or choose "
                                "another -o",
                                dir.string(), kMirrorFile));
      replacing = true;
    }
  }
  return replacing;
}

ExportReport export_mirror(const Store& store, const HubAddress& source,
                           std::vector<MirrorRef> refs, const stdfs::path& dir_in,
                           const ExportOptions& options) {
  if (refs.empty())
    throw Error(ErrorKind::kInvalidInput, "export: nothing to export (the config names no refs)");
  const stdfs::path dir = clean_dir(dir_in);

  // Merge refs naming the same (repo, tag); untagged pins by digest.
  std::map<std::pair<std::string, std::string>, MirrorRef> merged;
  for (auto& r : refs) {
    auto key = std::make_pair(r.repo, r.tag.empty() ? r.index.str() : r.tag);
    auto [it, fresh] = merged.emplace(key, r);
    if (fresh) continue;
    if (it->second.index != r.index)
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("export: {} resolved to two indexes ({} and {}); a mirror holds "
                              "one per tag: export them separately",
                              r.str(), it->second.index.str(), r.index.str()));
    it->second.all_variants = it->second.all_variants || r.all_variants;
    it->second.variants.insert(r.variants.begin(), r.variants.end());
    it->second.resolved_at = std::max(it->second.resolved_at, r.resolved_at);
  }

  const bool replacing = check_output_dir(dir, options.force);
  fs::make_dirs(dir.parent_path());
  const stdfs::path tmp =
      dir.parent_path() / ("." + dir.filename().string() + ".export-" + fs::random_hex(12));

  ExportReport report;
  report.dir = dir;
  report.info.source_hub_id = source.id();
  report.info.source = source.text;
  report.info.created = unix_now();
  try {
    fs::make_dirs(tmp);
    std::map<std::string, std::vector<oci::Descriptor>> entries;  // repo -> index.json entries
    for (auto& [key, ref] : merged) {
      const std::string what = ref.str();
      stdfs::path layout = tmp / ref.repo;
      if (!stdfs::exists(layout / "oci-layout")) {
        fs::make_dirs(layout / "blobs" / "sha256");
        fs::write_file_atomic(layout / "oci-layout", kOciLayoutFile, 0644);
      }
      ExportedRef out;
      auto count = [&](const oci::Descriptor& d, bool blob) {
        if (copy_blob(store, d, layout, what)) {
          ++report.files;
          report.bytes += static_cast<uint64_t>(d.size);
          if (blob) {
            ++out.blobs;
            out.bytes += static_cast<uint64_t>(d.size);
          }
        }
      };
      // The graph under the index, from the cache alone. Every variant manifest travels (small):
      // resolution on the other side sees the whole signed index. Only the selected variants'
      // configs and layers come along. Nested indexes stay behind (kernel packages have none).
      std::string root = cached_document(store, ref.index, what + ": the index");
      oci::Descriptor entry = oci::describe(root, oci::peek_media_type(root));
      oci::WalkOptions walk;
      walk.limits = options.graph_limits;
      oci::Graph graph = oci::walk_graph(
          entry, what,
          [&](const oci::Descriptor& d) -> std::optional<std::string> {
            if (d.digest == entry.digest) return root;
            if (oci::is_index(d.media_type)) {
              say(options.note, fmt::format("warning: {}: nested index {} left out (kernel "
                                            "packages have none)",
                                            what, d.digest.str()));
              return std::nullopt;
            }
            std::string bytes = cached_document(store, d.digest, what + ": variant manifest");
            oci::verify_bytes(d, bytes, what + ": variant manifest");
            return bytes;
          },
          walk);
      const oci::GraphNode& top = graph.nodes.front();
      entry.artifact_type = top.artifact_type;
      count(entry, false);
      auto export_blobs = [&](const oci::GraphNode& manifest) {
        for (size_t c : manifest.children) count(graph.nodes[c].desc, true);
      };
      if (top.kind == oci::NodeKind::kIndex) {
        std::set<Digest> listed, manifests;
        for (size_t c : top.children) {
          const oci::GraphNode& variant = graph.nodes[c];
          listed.insert(variant.desc.digest);
          if (variant.kind != oci::NodeKind::kManifest) continue;  // a nested index
          manifests.insert(variant.desc.digest);
          count(variant.desc, false);
          ++out.variants_total;
          if (ref.all_variants || ref.variants.count(variant.desc.digest)) {
            export_blobs(variant);
            ++out.variants_exported;
          }
        }
        for (auto& v : ref.variants)
          if (!listed.count(v))
            throw Error(ErrorKind::kInvalidInput,
                        fmt::format("export: {}: variant {} is not listed by index {}", what,
                                    v.str(), ref.index.str()));
        if (ref.all_variants) ref.variants = manifests;
      } else {
        export_blobs(top);
        out.variants_total = out.variants_exported = 1;
        ref.variants = {ref.index};
      }

      // The index's signature set, as cached (each envelope is verified where it is used).
      if (auto sigs = store.read_signatures(ref.index)) {
        trust::SignatureSet set;
        try {
          set = trust::SignatureSet::parse(*sigs, "cached signatures of " + what);
        } catch (const Error& e) {
          say(options.note, fmt::format("warning: {}: the cached signature set is unreadable "
                                        "({}); exported unsigned",
                                        what, e.what()));
        }
        if (!set.envelopes.empty()) {
          stdfs::path side = layout / signature_sidecar_rel(ref.index);
          trust::SignatureSet merged_set;
          if (auto prev = fs::read_file_if_exists(side, trust::kMaxSignatureSetBytes))
            merged_set = trust::SignatureSet::parse(*prev, side.string());
          for (auto& e : set.envelopes) {
            try {
              merged_set.add(e);
            } catch (const Error&) {
            }
          }
          fs::make_dirs(side.parent_path());
          fs::write_file_atomic(side, merged_set.serialize(), 0644);
          out.signatures = set.envelopes.size();
        }
      }
      if (out.signatures == 0)
        say(options.note, fmt::format("warning: {}: no signatures in the cache for {}; it will "
                                      "load from the mirror only with --allow-unsigned",
                                      what, ref.index.str()));

      if (!ref.tag.empty()) entry.annotations[std::string(oci::kAnnotationRefName)] = ref.tag;
      auto& list = entries[ref.repo];
      bool dup = false;
      for (auto& e : list) dup = dup || (e.digest == entry.digest && ref_name(e) == ref.tag);
      if (!dup) list.push_back(entry);
      say(options.note,
          fmt::format("{} {}: {} of {} variant{} with blobs ({} blob{}, {} bytes), {} "
                      "signature{}",
                      what, ref.index.str(), out.variants_exported, out.variants_total,
                      out.variants_total == 1 ? "" : "s", out.blobs, out.blobs == 1 ? "" : "s",
                      out.bytes, out.signatures, out.signatures == 1 ? "" : "s"));
      out.ref = ref;
      report.refs.push_back(out);
      report.info.refs.push_back(ref);
    }
    for (auto& [repo, list] : entries) {
      // An untagged entry is only needed when no tagged entry names the same index.
      std::vector<oci::Descriptor> kept;
      for (auto& e : list) {
        bool shadowed = false;
        if (ref_name(e).empty())
          for (auto& o : list)
            shadowed = shadowed || (o.digest == e.digest && !ref_name(o).empty());
        if (!shadowed) kept.push_back(e);
      }
      oci::Index index;
      index.manifests = kept;
      fs::write_file_atomic(tmp / repo / "index.json", oci::serialize(index), 0644);
    }
    fs::write_file_atomic(tmp / kMirrorFile, report.info.serialize(), 0644);
    install_dir(tmp, dir, replacing);
  } catch (...) {
    fs::remove_tree(tmp);
    throw;
  }
  return report;
}

// --- import ---

namespace {

struct Layout {
  std::string repo;
  stdfs::path path;
};

// Every layout under dir (a directory holding oci-layout), not following links.
std::vector<Layout> find_layouts(const stdfs::path& dir, ImportReport& report, const NoteFn& note) {
  std::vector<Layout> out;
  std::error_code ec;
  stdfs::recursive_directory_iterator it(dir, stdfs::directory_options::none, ec), end;
  if (ec) throw Error(ErrorKind::kIo, "import: cannot read " + dir.string() + ": " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec)
      throw Error(ErrorKind::kIo, "import: cannot read " + dir.string() + ": " + ec.message());
    if (!it->is_directory(ec) || it->is_symlink(ec)) {
      if (it->is_symlink(ec)) it.disable_recursion_pending();
      continue;
    }
    std::string name = it->path().filename().string();
    if (name.starts_with(".")) {
      it.disable_recursion_pending();
      continue;
    }
    if (!stdfs::is_regular_file(it->path() / "oci-layout", ec)) continue;
    it.disable_recursion_pending();  // a layout's blobs are not repositories
    std::string repo = it->path().lexically_relative(dir).generic_string();
    if (!is_valid_repo_name(repo)) {
      std::string w =
          fmt::format("{}: '{}' is not a repository name; skipped", it->path().string(), repo);
      warn(report, note, w);
      continue;
    }
    out.push_back(Layout{repo, it->path()});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.repo < b.repo; });
  return out;
}

// The index.json entries of a layout, read and validated.
std::vector<oci::Descriptor> layout_entries(const Layout& layout) {
  stdfs::path path = layout.path / "index.json";
  auto bytes = fs::read_file_if_exists(path, oci::kMaxManifestBytes);
  if (!bytes) return {};
  return oci::parse_index(*bytes, path.string()).manifests;
}

struct Staged {
  std::string repo;
  std::string tag;
  Digest index;
  ImportedRef* out = nullptr;
};

}  // namespace

ImportReport import_mirror(Store& store, const stdfs::path& dir_in, const ImportOptions& options) {
  const stdfs::path dir = clean_dir(dir_in);
  std::error_code ec;
  if (!stdfs::is_directory(dir, ec))
    throw Error(ErrorKind::kNotFound, "import: " + dir.string() +
                                          " is not a directory (a mirror made by `kernel-hub "
                                          "export -o DIR`, or any layout hub directory)");
  ImportReport report;
  report.dir = dir;
  HubAddress address = HubAddress::parse(dir.string(), false);
  report.mirror_hub_id = address.id();

  std::optional<MirrorInfo> info;
  if (auto text = fs::read_file_if_exists(dir / kMirrorFile, kMaxMirrorFileBytes)) {
    info = MirrorInfo::parse(*text, (dir / kMirrorFile).string());
    report.source_hub_id = info->source_hub_id;
    report.source = info->source;
  } else {
    std::string w = fmt::format(
        "{} has no {}: its refs are recorded under the directory's hub "
        "id only",
        dir.string(), kMirrorFile);
    warn(report, options.note, w);
  }

  auto source = open_layout_source(address, SourceOptions{});
  std::vector<Layout> layouts = find_layouts(dir, report, options.note);
  if (layouts.empty())
    throw Error(
        ErrorKind::kNotFound,
        "import: " + dir.string() + " holds no OCI image layout (no <org>/<name>/oci-layout)");

  std::vector<Staged> staged;
  report.refs.reserve(64);
  std::map<std::pair<std::string, Digest>, size_t> done;  // (repo, index) -> report.refs slot
  for (const Layout& layout : layouts) {
    for (const oci::Descriptor& entry : layout_entries(layout)) {
      const std::string tag = ref_name(entry);
      if (!tag.empty() && !is_valid_tag(tag)) {
        std::string w =
            fmt::format("{}: index.json entry with invalid tag '{}' skipped", layout.repo, tag);
        warn(report, options.note, w);
        continue;
      }
      const std::string what = layout.repo + "@" + (tag.empty() ? entry.digest.str() : tag);
      auto key = std::make_pair(layout.repo, entry.digest);
      if (auto it = done.find(key); it != done.end()) {
        ImportedRef& prev = report.refs[it->second];
        if (prev.tag.empty() && !tag.empty()) prev.tag = tag;  // keep the tag for messages
        staged.push_back(Staged{layout.repo, tag, entry.digest, nullptr});
        continue;
      }
      // The root document, verified against index.json's descriptor.
      FetchedManifest root = source->get_manifest(layout.repo, entry.digest.str());
      std::string mt = root.media_type.empty() ? oci::peek_media_type(root.bytes) : root.media_type;
      if (!store.has_blob(root.digest)) store.put_blob(oci::describe(root.bytes, mt), root.bytes);

      ImportedRef out;
      out.repo = layout.repo;
      out.tag = tag;
      out.index = entry.digest;
      const MirrorRef* listed = nullptr;
      if (info)
        for (auto& r : info->refs)
          if (r.repo == layout.repo && r.index == entry.digest) listed = &r;

      // The graph under the entry, from the mirror: the variant manifests the index lists (nested
      // indexes are not followed: kernel packages have none), each verified and stored. One the
      // mirror lacks is a warning, unless kernel-hub-mirror.json says it was exported.
      const oci::Descriptor top_desc = oci::describe(root.bytes, mt);
      oci::WalkOptions walk;
      walk.limits = options.graph_limits;
      oci::Graph graph = oci::walk_graph(
          top_desc, what,
          [&](const oci::Descriptor& d) -> std::optional<std::string> {
            if (d.digest == top_desc.digest) return root.bytes;
            if (oci::is_index(d.media_type)) return std::nullopt;
            FetchedManifest m;
            try {
              m = source->get_manifest(layout.repo, d.digest.str());
            } catch (const Error& e) {
              if (e.kind() != ErrorKind::kNotFound) throw;
              std::string w = fmt::format(
                  "{}: variant manifest {} is not in the mirror; offline "
                  "resolution of this ref needs every variant manifest",
                  what, d.digest.str());
              warn(report, options.note, w);
              if (listed && listed->variants.count(d.digest))
                throw Error(ErrorKind::kNotFound,
                            fmt::format("import {}: {}: variant manifest {} is listed in {} but "
                                        "missing; the mirror is incomplete: export it again",
                                        dir.string(), what, d.digest.str(), kMirrorFile));
              return std::nullopt;
            }
            oci::verify_bytes(d, m.bytes, what + ": variant manifest");
            if (!store.has_blob(d.digest)) store.put_blob(d, m.bytes);
            return std::move(m.bytes);
          },
          walk);

      std::vector<const oci::GraphNode*> manifests;  // the variants the mirror holds
      const oci::GraphNode& top = graph.nodes.front();
      if (top.kind == oci::NodeKind::kIndex) {
        for (size_t c : top.children) {
          const oci::GraphNode& variant = graph.nodes[c];
          if (variant.kind != oci::NodeKind::kManifest) continue;  // a nested index
          ++out.variants_total;
          if (variant.bytes) manifests.push_back(&variant);
        }
      } else {
        out.variants_total = 1;
        manifests.push_back(&top);
      }

      for (const oci::GraphNode* manifest : manifests) {
        const oci::Descriptor& desc = manifest->desc;
        std::vector<oci::Descriptor> blobs;
        for (size_t c : manifest->children) blobs.push_back(graph.nodes[c].desc);
        std::vector<oci::Descriptor> fetch;
        bool complete = true;
        for (auto& b : blobs) {
          if (store.has_blob(b.digest)) {
            ++report.blobs_cached;
            continue;
          }
          if (b.data) {
            if (auto raw = base64_decode(*b.data)) {
              store.put_blob(b, *raw);
              continue;
            }
          }
          // Present in the mirror means "must verify"; absent means "not exported".
          if (stdfs::exists(layout.path / "blobs" / "sha256" / b.digest.hex, ec)) {
            fetch.push_back(b);
          } else {
            complete = false;
          }
        }
        std::vector<std::unique_ptr<BlobWriter>> writers;
        std::vector<BlobFetch> fetches;
        for (auto& b : fetch) {
          writers.push_back(store.begin_blob(b));
          fetches.push_back(BlobFetch{b, writers.back().get(), false, {}});
        }
        if (!fetches.empty()) source->fetch_blobs(layout.repo, fetches, nullptr);
        for (size_t i = 0; i < fetches.size(); ++i) {
          const oci::Descriptor& b = fetches[i].desc;
          std::string problem = fetches[i].error;
          if (fetches[i].ok) {
            try {
              writers[i]->commit();
              ++report.blobs_imported;
              report.bytes_imported += static_cast<uint64_t>(b.size);
              continue;
            } catch (const Error& e) {
              problem = e.what();
            }
          }
          throw Error(
              ErrorKind::kIntegrity,
              fmt::format("import {}: {}: blob {} ({}) does not verify: {}; the mirror "
                          "is damaged or was tampered with: nothing was recorded (export "
                          "it again from the source hub)",
                          dir.string(), what, b.digest.str(),
                          (layout.path / "blobs" / "sha256" / b.digest.hex).string(), problem));
        }
        if (!complete) {
          if (listed && (listed->all_variants || listed->variants.count(desc.digest)))
            throw Error(ErrorKind::kNotFound,
                        fmt::format("import {}: {}: variant {} is listed in {} but its blobs are "
                                    "missing; the mirror is incomplete: export it again",
                                    dir.string(), what, desc.digest.str(), kMirrorFile));
          continue;  // a variant the mirror does not carry
        }
        // Nothing is unpacked: a package is unpacked when it is loaded, after its trust check.
        ++out.variants_complete;
      }

      // Signatures: merged into the cache's set for the index (verified whenever used).
      oci::Descriptor subject = oci::describe(root.bytes, mt);
      trust::SignatureSet sigs = source->get_signatures(layout.repo, subject);
      out.signatures = sigs.envelopes.size();
      if (!sigs.envelopes.empty()) {
        trust::SignatureSet merged = sigs;
        if (auto cached = store.read_signatures(entry.digest)) {
          try {
            for (auto& e : trust::SignatureSet::parse(*cached, "cached signatures").envelopes) {
              try {
                merged.add(e);
              } catch (const Error&) {
              }
            }
          } catch (const Error&) {
          }
        }
        store.write_signatures(entry.digest, merged.serialize());
      } else {
        std::string w = fmt::format(
            "{}: the mirror holds no signatures for {}; it loads only "
            "with --allow-unsigned",
            what, entry.digest.str());
        warn(report, options.note, w);
      }
      say(options.note, fmt::format("{} {}: {} of {} variant{} complete, {} signature{}", what,
                                    entry.digest.str(), out.variants_complete, out.variants_total,
                                    out.variants_total == 1 ? "" : "s", out.signatures,
                                    out.signatures == 1 ? "" : "s"));
      done.emplace(key, report.refs.size());
      report.refs.push_back(std::move(out));
      staged.push_back(Staged{layout.repo, tag, entry.digest, nullptr});
    }
  }

  // Everything verified: the ref records, under the mirror's id and the source hub's.
  const int64_t now = unix_now();
  for (auto& s : staged) {
    ImportedRef& out = report.refs[done.at({s.repo, s.index})];
    const std::string name = s.tag.empty() ? s.index.str() : s.tag;
    int64_t resolved_at = info && info->created ? info->created : now;
    if (info)
      for (auto& r : info->refs)
        if (r.repo == s.repo && r.tag == s.tag && r.index == s.index && r.resolved_at)
          resolved_at = r.resolved_at;
    auto recorded = [&out](const std::string& id) {
      if (std::find(out.hub_ids.begin(), out.hub_ids.end(), id) == out.hub_ids.end())
        out.hub_ids.push_back(id);
    };
    store.write_ref(RefRecord{report.mirror_hub_id, s.repo, name, s.index, now});
    recorded(report.mirror_hub_id);
    if (info && info->source_hub_id != report.mirror_hub_id) {
      auto prev = store.read_ref(info->source_hub_id, s.repo, name);
      if (prev && prev->digest == s.index && prev->resolved_at >= resolved_at) {
        recorded(info->source_hub_id);  // already recorded, as recently
        continue;
      }
      // Another hub's record is never replaced by a mirror (a hostile mirror must not redirect
      // a hub's tags); the mirror only fills in a record the cache does not have.
      if (prev) {
        out.kept.push_back(info->source_hub_id);
        std::string w = fmt::format(
            "{}@{}: the cache already records {} for {} (resolved {}); a mirror never replaces "
            "another hub's record, so it is kept (the mirror's {} is recorded under {})",
            s.repo, name, prev->digest.str(), info->source_hub_id, prev->resolved_at, s.index.str(),
            report.mirror_hub_id);
        warn(report, options.note, w);
        continue;
      }
      store.write_ref(RefRecord{info->source_hub_id, s.repo, name, s.index, resolved_at});
      recorded(info->source_hub_id);
    }
  }
  return report;
}

}  // namespace kh::mirror
