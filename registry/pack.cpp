#include "registry/pack.h"

#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "hub/base/clock.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/hub.h"
#include "hub/oci/ref.h"
#include "hub/store/archive.h"
#include "hub/transport/source.h"
#include "kernel_hub/kernel_hub_abi.h"
#include "loader/cuda_arch.h"
#include "loader/nvrtc.h"
#include "loader/package_check.h"
#include "registry/device.h"
#include "registry/json_path.h"
#include "registry/package_manifest.h"
#include "registry/resolver.h"

namespace kh {

namespace stdfs = std::filesystem;
using nlohmann::json;

std::optional<std::string> channel_tag_of(const std::string& version) {
  size_t n = 0;
  while (n < version.size() && n < 6 && version[n] >= '0' && version[n] <= '9') ++n;
  if (n == 0) return std::nullopt;
  return "v" + std::to_string(std::stoi(version.substr(0, n)));
}

namespace {

std::vector<std::string> dtype_list(uint32_t dtypes) {
  std::vector<std::string> out;
  if (dtypes & KH_DTYPE_BF16) out.push_back("bf16");
  if (dtypes & KH_DTYPE_FP16) out.push_back("fp16");
  if (dtypes & KH_DTYPE_FP32) out.push_back("fp32");
  return out;
}

}  // namespace

std::map<std::string, PackageLayer> package_layers_of(const ModuleView& v, const stdfs::path& dir) {
  std::map<std::string, PackageLayer> out;
  for (const kh_layer_v1_t* l : v.layers) {
    PackageLayer p;
    p.forward = l->forward;
    if (l->forward_train) p.forward_train = l->forward_train;
    p.has_backward = l->backward != nullptr && (l->flags & KH_FLAG_HAS_BACKWARD) != 0;
    if (p.has_backward) p.backward = l->backward;
    p.graph_safe = (l->flags & KH_FLAG_GRAPH_SAFE) != 0;
    p.deterministic = (l->flags & KH_FLAG_DETERMINISTIC) != 0;
    p.dtypes = dtype_list(l->dtypes);
    if (p.dtypes.empty())
      throw Error(ErrorKind::kRefused,
                  fmt::format("{}: layer {} declares no dtype (KH_DTYPE_BF16/FP16/FP32); "
                              "a published layer must say what it accepts",
                              dir.string(), l->name));
    out[l->name] = std::move(p);
  }
  if (out.empty())
    throw Error(ErrorKind::kRefused,
                fmt::format("{}: the module declares no layers; nothing to publish", dir.string()));
  return out;
}

namespace {

// What the build's kernel.json says. Read leniently: the build may write the short loader form
// (name, version, host_library) or a fuller one; the layers come from the module itself.
struct SourceManifest {
  std::string name, version, host_library, cuda_source, cuda_version;
  std::map<std::string, std::string> cubins;  // prebuilt, sm -> file
};

std::string string_field(const json& j, const char* key, const stdfs::path& file, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required)
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("pack: {}: \"{}\" is missing; the package's kernel.json needs name, "
                              "version and host_library",
                              file.string(), key));
    return {};
  }
  if (!it->is_string() || it->get<std::string>().empty())
    throw Error(ErrorKind::kInvalidInput, fmt::format("pack: {}: \"{}\" must be a non-empty "
                                                      "string, got {}",
                                                      file.string(), key, json_describe(*it)));
  return it->get<std::string>();
}

// A plain file name inside the package (no directories, no "..").
void require_plain_name(const std::string& name, const stdfs::path& file, const char* key) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\\') != std::string::npos)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("pack: {}: \"{}\" = '{}' must be a file name in the package directory",
                            file.string(), key, name));
}

SourceManifest read_source_manifest(const stdfs::path& dir) {
  stdfs::path file = dir / kPackageManifestName;
  std::string text;
  try {
    text = fs::read_file(file, kMaxPackageManifestBytes);
  } catch (const Error& e) {
    throw Error(e.kind(), fmt::format("pack: {}: {}; pack takes a built package directory "
                                      "(host library, kernel.json, .cu source)",
                                      dir.string(), e.what()));
  }
  json j = parse_json_document(text, file.string(), kMaxPackageManifestBytes);
  if (!j.is_object())
    throw Error(ErrorKind::kInvalidInput, fmt::format("pack: {}: expected a JSON object, got {}",
                                                      file.string(), json_describe(j)));
  SourceManifest m;
  m.name = string_field(j, "name", file, true);
  m.version = string_field(j, "version", file, true);
  m.host_library = string_field(j, "host_library", file, true);
  require_plain_name(m.host_library, file, "host_library");
  m.cuda_source = string_field(j, "cuda_source", file, false);
  if (m.cuda_source.empty()) m.cuda_source = string_field(j, "device_source", file, false);
  if (!m.cuda_source.empty()) require_plain_name(m.cuda_source, file, "cuda_source");
  if (auto c = j.find("cuda"); c != j.end() && c->is_object()) {
    if (auto v = c->find("version"); v != c->end() && v->is_string()) {
      m.cuda_version = v->get<std::string>();
      if (!parse_cuda_version(m.cuda_version))
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("pack: {}: cuda.version '{}' is not a CUDA version like 12.4",
                                file.string(), m.cuda_version));
    }
  }
  if (auto c = j.find("cubins"); c != j.end() && c->is_object()) {
    for (auto& [sm, f] : c->items()) {
      if (!f.is_string() || !CudaArch::parse(sm))
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("pack: {}: cubins.{} must map an sm like 90a to a file name",
                                file.string(), sm));
      require_plain_name(f.get<std::string>(), file, "cubins");
      m.cubins[CudaArch::parse(sm)->number()] = f.get<std::string>();
    }
  }
  return m;
}

std::vector<CudaArch> parse_sms(const std::vector<std::string>& sms) {
  std::set<CudaArch> set;
  for (auto& s : sms) {
    auto a = CudaArch::parse(s);
    if (!a)
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("pack: '{}' is not an sm; expected e.g. 80, 86, 89, 90, 90a", s));
    set.insert(*a);
  }
  return {set.begin(), set.end()};
}

void copy_into(const stdfs::path& from, const stdfs::path& to) {
  std::error_code ec;
  auto st = stdfs::symlink_status(from, ec);
  if (ec || !stdfs::is_regular_file(st))
    throw Error(ec ? ErrorKind::kNotFound : ErrorKind::kRefused,
                fmt::format("pack: {} is {}; the package needs it as a regular file", from.string(),
                            ec ? "missing" : "not a regular file"));
  fs::write_file_atomic(to, fs::read_file(from), 0644);
}

// A temp working directory removed on scope exit.
struct WorkDir {
  stdfs::path path;
  WorkDir() {
    path = stdfs::temp_directory_path() / ("kh-pack-" + fs::random_hex(12));
    fs::make_dirs(path);
  }
  ~WorkDir() {
    try {
      fs::remove_tree(path);
    } catch (...) {  // a leftover temp dir is not worth failing the pack for
    }
  }
};

std::string title_stem(const std::string& name) {
  std::string stem = name.substr(name.rfind('/') + 1);
  for (auto& c : stem)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  return stem;
}

}  // namespace

namespace {

// Default serial of a new statement: now in unix seconds, or one above the serial the layout's
// current index for that tag was signed with (two packs within a second must still grow).
uint64_t next_serial(Source& out, const std::string& repo, const trust::Statement& st,
                     int64_t now) {
  std::vector<std::string> tags;
  try {
    tags = out.list_tags(repo);
  } catch (const Error&) {
    tags.clear();  // a new layout
  }
  if (std::find(tags.begin(), tags.end(), st.tag) == tags.end())
    return trust::next_serial({}, st, now);
  oci::Descriptor current;
  current.digest = out.get_manifest(repo, st.tag).digest;
  return trust::next_serial(out.get_signatures(repo, current), st, now);
}

}  // namespace

PackReport pack_package(const PackOptions& o) {
  const stdfs::path dir = o.package_dir;
  if (!stdfs::is_directory(dir))
    throw Error(
        ErrorKind::kNotFound,
        fmt::format("pack: {} is not a directory; pass a built package directory", dir.string()));
  if (o.output.empty())
    throw Error(ErrorKind::kInvalidInput, "pack: no output layout given (-o DIR)");
  if (!o.repo.empty() && !is_valid_repo_name(o.repo))
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("pack: '{}' is not a repository name like org/name", o.repo));
  if (o.devices.empty())
    throw Error(ErrorKind::kInvalidInput, "pack: no device variant asked for (cuda, cpu)");
  for (auto& d : o.devices)
    if (d != "cuda" && d != "cpu")
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("pack: unknown device '{}'; expected cuda or cpu", d));

  SourceManifest src = read_source_manifest(dir);
  PackReport report;
  report.name = src.name;
  report.version = src.version;

  // Tags: channels, then the exact version. All checked before anything is written.
  std::vector<std::string> tags = o.tags;
  if (tags.empty()) {
    auto channel = channel_tag_of(src.version);
    if (channel) tags.push_back(*channel);
  }
  if (is_valid_tag(src.version)) tags.push_back(src.version);
  std::vector<std::string> unique_tags;
  for (auto& t : tags) {
    if (!is_valid_tag(t))
      throw Error(
          ErrorKind::kInvalidInput,
          fmt::format("pack: '{}' is not a valid tag ([a-zA-Z0-9_][a-zA-Z0-9._-]{{0,127}})", t));
    if (std::find(unique_tags.begin(), unique_tags.end(), t) == unique_tags.end())
      unique_tags.push_back(t);
  }
  if (unique_tags.empty())
    throw Error(
        ErrorKind::kInvalidInput,
        fmt::format("pack: version '{}' is no valid tag and no --tag was given", src.version));
  report.tags = unique_tags;

  // The loader's own checks, exactly as `kernel-hub check` runs them.
  PackageCheck check = check_package(dir);
  for (auto& c : check.report.checks)
    if (c.passed && c.warning) report.notes.push_back(c.message);
  if (!check.ok()) {
    throw Error(ErrorKind::kRefused,
                fmt::format("pack {}: the host library failed the loader's checks (run `kernel-hub "
                            "check {}` for the full report); fix the build and pack again:{}",
                            dir.string(), dir.string(), check.failures()));
  }
  const ModuleView& module = check.module->view;
  PackageManifest base;
  base.name = src.name;
  base.version = src.version;
  base.abi_major = KH_ABI_MAJOR;
  base.abi_minor = module.abi_minor;
  base.host_library = src.host_library;
  base.layers = package_layers_of(module, dir);
  const std::string abi_text = fmt::format("{}.{}", base.abi_major, base.abi_minor);
  const std::string os = o.os.empty() ? local_os() : o.os;
  const std::string arch = o.arch.empty() ? local_arch() : o.arch;

  WorkDir work;
  struct Staged {
    std::string device;
    oci::Descriptor layer, entry;
    stdfs::path archive;
    std::string manifest_bytes;
    std::vector<std::string> files;
  };
  std::vector<Staged> staged;

  for (const std::string& device : o.devices) {
    stdfs::path stage = work.path / ("stage-" + device);
    fs::make_dirs(stage);
    copy_into(dir / src.host_library, stage / src.host_library);
    PackageManifest m = base;
    m.device = device;
    oci::Annotations ann;
    ann[std::string(kAnnotationDevice)] = device;
    ann[std::string(kAnnotationAbi)] = abi_text;
    if (device == "cuda") {
      std::vector<CudaArch> archs = parse_sms(o.sms);
      if (src.cuda_source.empty() && src.cubins.empty())
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("pack {}: the cuda variant needs device code, but kernel.json "
                                "names no cuda_source and no cubins; add them, or pack the cpu "
                                "variant only (--devices cpu)",
                                dir.string()));
      std::string source_text;
      if (!src.cuda_source.empty()) source_text = fs::read_file(dir / src.cuda_source);
      if (!archs.empty() && source_text.empty())
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("pack {}: cubins for {} were asked for, but there is no .cu "
                                "source to compile; pass the prebuilt cubins' sms only",
                                dir.string(), o.sms.front()));
      std::string compiled_with;
      if (!archs.empty()) {
        const NvrtcInfo* nv = nullptr;
        try {
          nv = &nvrtc();
        } catch (const Error& e) {
          throw Error(ErrorKind::kNotFound,
                      fmt::format("pack {}: compiling cubins needs NVRTC: {}; or pass an empty sm "
                                  "list (--sm '') for a source-only cuda variant",
                                  dir.string(), e.what()));
        }
        compiled_with = nv->version.str();
        std::string stem = stdfs::path(src.cuda_source).stem().string();
        // Each compile runs on its own thread (NVRTC caps concurrency itself).
        std::vector<std::future<std::string>> jobs;
        for (auto& a : archs) {
          jobs.push_back(std::async(std::launch::async, [&, a] {
            return nvrtc_compile_cubin(source_text, src.cuda_source, nvrtc_options(a, nv->version),
                                       (dir / src.cuda_source).string());
          }));
        }
        for (size_t i = 0; i < archs.size(); ++i) {
          std::string cubin = jobs[i].get();
          std::string file = fmt::format("{}.{}.cubin", stem, archs[i].sm());
          fs::write_file_atomic(stage / file, cubin, 0644);
          m.cubins[archs[i].number()] = file;
        }
      }
      // Prebuilt cubins for targets not compiled here travel as they are.
      for (auto& [sm, file] : src.cubins) {
        if (m.cubins.count(sm)) continue;
        copy_into(dir / file, stage / file);
        m.cubins[sm] = file;
      }
      if (o.include_source && !src.cuda_source.empty()) {
        fs::write_file_atomic(stage / src.cuda_source, source_text, 0644);
        m.cuda_source = src.cuda_source;
      }
      if (m.cubins.empty() && m.cuda_source.empty())
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("pack {}: the cuda variant would hold no device code (no sm asked "
                                "for and the source left out)",
                                dir.string()));
      m.cuda_version = !o.cuda_version.empty()     ? o.cuda_version
                       : !compiled_with.empty()    ? compiled_with
                       : !src.cuda_version.empty() ? src.cuda_version
                                                   : "12.0";
      if (!parse_cuda_version(m.cuda_version))
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("pack: CUDA version '{}' is not like 12.4", m.cuda_version));
      std::vector<CudaArch> listed;
      for (auto& [sm, f] : m.cubins) listed.push_back(*CudaArch::parse(sm));
      std::sort(listed.begin(), listed.end());
      std::string sm_list;
      for (auto& a : listed) sm_list += (sm_list.empty() ? "" : ",") + a.number();
      ann[std::string(kAnnotationCudaVersion)] = m.cuda_version;
      if (!sm_list.empty()) ann[std::string(kAnnotationCudaSm)] = sm_list;
      ann[std::string(kAnnotationSource)] = m.has_source() ? "true" : "false";
    }
    // The layers travel in the signed index too, so that a resolver knows which layers and ops
    // a variant has without fetching it (old resolvers ignore the key).
    std::string layers_text = serialize_package_layers(m.layers);
    if (layers_text.size() <= kMaxLayersAnnotationBytes) {
      ann[std::string(kAnnotationLayers)] = layers_text;
    } else {
      report.notes.push_back(fmt::format(
          "the {} variant's layers take {} bytes, over the {}-byte kernelhub.layers limit: left "
          "out of the index, so resolvers fetch the variant to read its layers",
          device, layers_text.size(), kMaxLayersAnnotationBytes));
    }
    m.files = hash_package_files(stage);
    std::string manifest_text = m.serialize();
    PackageManifest::parse(manifest_text, "generated kernel.json");  // our own output validates
    fs::write_file_atomic(stage / kPackageManifestName, manifest_text, 0644);
    // kernel.json's digest in the signed index: what a load may use is fixed by the signature,
    // not by whatever kernel.json a cache holds.
    ann[std::string(kAnnotationPackageManifest)] = sha256_of(manifest_text).str();

    Staged s;
    s.device = device;
    for (auto& [f, d] : m.files) s.files.push_back(f);
    s.files.push_back(std::string(kPackageManifestName));
    s.archive = work.path / (device + ".tar.zst");
    create_archive(stage, s.archive);
    s.layer.media_type = std::string(oci::kMediaTypeLayerTarZstd);
    s.layer.digest = sha256_of_file(s.archive);
    s.layer.size = static_cast<int64_t>(stdfs::file_size(s.archive));
    s.layer.annotations[std::string(oci::kAnnotationTitle)] =
        fmt::format("{}-{}-{}.tar.zst", title_stem(src.name), src.version, device);
    oci::Manifest manifest;
    manifest.artifact_type = std::string(oci::kArtifactTypeKernel);
    manifest.config = oci::empty_descriptor();
    manifest.layers.push_back(s.layer);
    // The variant describes itself: the index entry's annotations, and its platform (an OCI
    // manifest has no platform field; our config is the empty descriptor), are in the manifest
    // too, so a manifest copied alone (skopeo copy without --all) still resolves.
    manifest.annotations = ann;
    manifest.annotations[std::string(kAnnotationPlatform)] = os + "/" + arch;
    s.manifest_bytes = oci::serialize(manifest);
    s.entry = oci::describe(s.manifest_bytes, oci::kMediaTypeManifest);
    s.entry.platform = oci::Platform{os, arch, ""};
    s.entry.annotations = std::move(ann);
    staged.push_back(std::move(s));
  }

  oci::Index index;  // no artifactType: see the header (skopeo 1.9.3)
  for (auto& s : staged) index.manifests.push_back(s.entry);
  index.annotations[std::string(oci::kAnnotationVersion)] = src.version;
  index.annotations[std::string(oci::kAnnotationTitle)] = src.name;
  std::string index_bytes = oci::serialize(index);
  report.index = oci::describe(index_bytes, oci::kMediaTypeIndex);

  // Blobs, then manifests, then the index under each tag (index.json replaced last).
  SourceOptions source_options;
  std::unique_ptr<Source> out;
  std::string repo = o.repo;
  if (o.repo.empty()) {
    fs::make_dirs(o.output);
    out = open_single_layout_source(o.output, source_options);
    report.layout = o.output;
  } else {
    fs::make_dirs(o.output);
    out = open_layout_source(HubAddress::parse(o.output.string(), false), source_options);
    report.layout = o.output / o.repo;
  }
  for (auto& s : staged) {
    out->push_blob(repo, s.layer, s.archive);
    out->push_manifest(repo, s.entry.digest.str(), s.manifest_bytes, oci::kMediaTypeManifest);
    report.variants.push_back(PackedVariant{s.device, s.entry, s.layer, s.files});
  }
  // The index by digest, its signatures, and only then the tags: a reader never sees a tag
  // whose signature is still missing.
  out->push_manifest(repo, report.index.digest.str(), index_bytes, oci::kMediaTypeIndex);
  if (o.sign_key) {
    const int64_t now = unix_now();
    for (auto& t : unique_tags) {
      trust::Statement st;
      st.hub_id = o.sign_hub_id;
      st.repo = !o.sign_repo.empty() ? o.sign_repo : !o.repo.empty() ? o.repo : src.name;
      if (!is_valid_repo_name(st.repo))
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("pack --sign: the package name '{}' is not a repository name like "
                                "org/name; name the repo the statements bind",
                                st.repo));
      st.tag = t;
      st.index = report.index.digest;
      st.serial = o.sign_serial ? o.sign_serial : next_serial(*out, repo, st, now);
      st.expires = o.sign_expires ? o.sign_expires : now + SignOptions::kDefaultValidity;
      out->push_signature(repo, report.index, trust::sign_statement(st, *o.sign_key));
      report.signed_statements.push_back(st);
    }
  }
  for (auto& t : unique_tags) out->push_manifest(repo, t, index_bytes, oci::kMediaTypeIndex);
  return report;
}

}  // namespace kh
