// export and import: offline mirrors (hub/mirror/mirror.h). `export` resolves what a KernelConfig (or a
// lock file) needs on the current hub, pulls it into the cache like `pull --config`, and writes
// an OCI layout hub directory from the cache; `import` fills a cache from such a directory with
// no network, recording refs under the mirror's hub id and the original hub's.
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "hub/base/clock.h"
#include "hub/base/error.h"
#include "hub/mirror/mirror.h"
#include "registry/kernel_config.h"
#include "registry/kernelize.h"
#include "registry/lock_file.h"
#include "registry/resolver.h"
#include "tools/kernel-hub/cli.h"

namespace kh::cli {

namespace {

// --device/--sm/--cuda/--os/--arch and repeatable --target, as `lock` takes them.
struct MirrorDeviceArgs {
  std::string key, sm, cuda, os, arch;
  std::vector<std::string> targets;

  void add(CLI::App* cmd) {
    cmd->add_option("--device", key,
                    "cpu (default: this machine), cuda:N (GPU N of this machine) or cuda with "
                    "--sm and --cuda (any GPU, described by hand)");
    cmd->add_option("--sm", sm, "cuda: compute capability, e.g. 90 (H100/H200), 80, 89");
    cmd->add_option("--cuda", cuda, "cuda: the CUDA version the driver supports, e.g. 13.0");
    cmd->add_option("--os", os, "OCI platform os (default: this machine's)");
    cmd->add_option("--arch", arch, "OCI platform architecture (default: this machine's)");
    cmd->add_option("--target", targets,
                    "A target device, repeatable: cpu, cpu:OS/ARCH, cuda:sm_90:cuda_13.0 or "
                    "cuda:sm_90:cuda_13.0:OS/ARCH");
  }
  bool has_group() const {
    return !key.empty() || !sm.empty() || !cuda.empty() || !os.empty() || !arch.empty();
  }
  std::vector<Device> all() const {
    std::vector<Device> out;
    for (auto& t : targets) out.push_back(parse_device_target(t));
    if (has_group() || out.empty()) {
      if (!has_group()) {
        out.push_back(local_cpu_device());
      } else {
        DeviceFields f;
        f.key = key.empty() ? (sm.empty() && cuda.empty() ? "cpu" : "cuda") : key;
        if (!sm.empty()) f.sm = sm;
        if (!cuda.empty()) f.cuda = cuda;
        if (!os.empty()) f.os = os;
        if (!arch.empty()) f.arch = arch;
        out.push_back(make_device(f));
      }
    }
    return out;
  }
};

struct ExportArgs {
  std::string config, lock, out;
  MirrorDeviceArgs dev;
  bool all_variants = false;
  bool force = false;
};

int run_export(Context& ctx, const ExportArgs& a) {
  const bool json = ctx.options().json;
  auto note = [&](const std::string& line) { ctx.note_or_warn(line); };
  if (a.config.empty() == a.lock.empty())
    throw Error(ErrorKind::kInvalidInput, "export: give --config FILE or --lock FILE (one)");
  // As for pull: a lock pins its targets and --all-variants takes every variant, so device
  // options would be ignored without a word.
  if ((a.dev.has_group() || !a.dev.targets.empty()) && (!a.lock.empty() || a.all_variants))
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("export: --device/--sm/--cuda/--os/--arch/--target cannot be "
                            "combined with {}: {}; leave the device options out",
                            a.lock.empty() ? "--all-variants" : "--lock",
                            a.lock.empty() ? "it exports every variant of every ref"
                                           : "it exports exactly the targets the lock file pins"));
  mirror::check_output_dir(a.out, a.force);  // before any download

  // Like pull --config: ask the hub for every tag now (no ref TTL), fetch into the cache.
  HubOptions o = ctx.hub_options();
  o.ref_ttl_s = 0;
  Hub hub(ctx.hub().address(), ctx.store(), o);
  Store& store = ctx.store();
  const std::string hub_id = hub.address().id();
  auto resolved_at = [&](const Ref& ref) -> int64_t {
    if (ref.digest) return unix_now();
    auto rec = store.read_ref(hub_id, ref.repo, ref.tag);
    return rec ? rec->resolved_at : unix_now();
  };
  auto fetch_targets = [&](const LockEntry& e, mirror::MirrorRef& mr) {
    for (auto& [target, t] : e.targets) {
      bool fetched = false;
      fetch_lock_target(hub, e.ref.repo, t, &fetched);
      mr.variants.insert(t.manifest_digest);
      note(fmt::format("{} {}: {} ({})", e.ref.str(), target, t.manifest_digest.str(),
                       fetched ? "fetched" : "cached"));
    }
  };

  std::vector<mirror::MirrorRef> refs;
  if (!a.lock.empty()) {
    LockFile lock = LockFile::load(a.lock);
    for (auto& e : lock.entries) {
      if (e.hub != hub_id)
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("export --lock {}: {} was locked on hub {}, but this export reads "
                                "{}; pass --hub for that hub",
                                a.lock, e.ref.str(), e.hub, hub_id));
      Ref pinned{e.ref.repo, "", e.index_digest};
      mirror::MirrorRef mr{e.ref.repo, e.ref.tag, e.index_digest, a.all_variants, {}, 0};
      mr.resolved_at = resolved_at(e.ref);
      if (a.all_variants) {
        PullReport r = hub.pull(pinned);
        note(fmt::format("{} {} (every variant: {} manifests, downloaded {})", e.ref.str(),
                         r.digest.str(), r.manifests, human_bytes(r.bytes_downloaded)));
      } else {
        hub.info(pinned);  // the index and every variant manifest, by the locked digest
        fetch_targets(e, mr);
      }
      refs.push_back(std::move(mr));
    }
  } else {
    KernelConfig config = KernelConfig::load(a.config);
    if (a.all_variants) {
      for (auto& ref : config.refs()) {
        PullReport r = hub.pull(ref);
        note(fmt::format("{} {} (every variant: {} manifests, downloaded {})", ref.str(),
                         r.digest.str(), r.manifests, human_bytes(r.bytes_downloaded)));
        refs.push_back(mirror::MirrorRef{ref.repo, ref.tag, r.digest, true, {}, resolved_at(ref)});
      }
    } else {
      std::vector<Device> devices = a.dev.all();
      KernelizeIndexProvider provider(hub);
      LockBuild built = build_lock(config, devices, provider);
      built.require_complete("export", a.out);
      for (auto& e : built.lock.entries) {
        mirror::MirrorRef mr{e.ref.repo, e.ref.tag, e.index_digest, false, {}, resolved_at(e.ref)};
        fetch_targets(e, mr);
        refs.push_back(std::move(mr));
      }
    }
  }
  // The signatures of every index come along (online: refreshed from the hub).
  for (auto& r : refs)
    if (!hub.options().offline) hub.signatures(r.repo, r.index, true);

  mirror::ExportOptions eo;
  eo.force = a.force;
  eo.note = note;
  mirror::ExportReport rep = mirror::export_mirror(store, hub.address(), refs, a.out, eo);

  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (auto& r : rep.refs) {
      nlohmann::json variants = nlohmann::json::array();
      for (auto& v : r.ref.variants) variants.push_back(v.str());
      list.push_back({{"ref", r.ref.str()},
                      {"index_digest", r.ref.index.str()},
                      {"variants_total", r.variants_total},
                      {"variants_exported", r.variants_exported},
                      {"variants", variants},
                      {"blobs", r.blobs},
                      {"bytes", r.bytes},
                      {"signatures", r.signatures}});
    }
    ctx.print_json({{"dir", rep.dir.string()},
                    {"source_hub_id", rep.info.source_hub_id},
                    {"source", rep.info.source},
                    {"created", rep.info.created},
                    {"files", rep.files},
                    {"bytes", rep.bytes},
                    {"refs", list}});
    return 0;
  }
  ctx.say(fmt::format("exported {} ref{} from {} to {} ({} files, {})", rep.refs.size(),
                      rep.refs.size() == 1 ? "" : "s", hub.address().text, rep.dir.string(),
                      rep.files, human_bytes(rep.bytes)));
  for (auto& r : rep.refs)
    ctx.say(fmt::format("  {} {}: {}/{} variants with blobs, {} signature{}", r.ref.str(),
                        r.ref.index.str(), r.variants_exported, r.variants_total, r.signatures,
                        r.signatures == 1 ? "" : "s"));
  ctx.say(
      fmt::format("air-gapped: `kernel-hub import {}` (then --offline against {}), or "
                  "`--hub {}`",
                  rep.dir.string(), hub.address().text, rep.dir.string()));
  return 0;
}

int run_import(Context& ctx, const std::string& dir) {
  const bool json = ctx.options().json;
  mirror::ImportOptions io;
  io.note = [&](const std::string& line) { ctx.note_or_warn(line); };
  mirror::ImportReport rep = mirror::import_mirror(ctx.store(), dir, io);
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (auto& r : rep.refs)
      list.push_back({{"ref", r.repo + "@" + (r.tag.empty() ? r.index.str() : r.tag)},
                      {"index_digest", r.index.str()},
                      {"variants_total", r.variants_total},
                      {"variants_complete", r.variants_complete},
                      {"signatures", r.signatures},
                      {"hub_ids", r.hub_ids},
                      {"kept", r.kept}});
    ctx.print_json({{"dir", rep.dir.string()},
                    {"cache", ctx.store().root().string()},
                    {"mirror_hub_id", rep.mirror_hub_id},
                    {"source_hub_id", rep.source_hub_id},
                    {"source", rep.source},
                    {"blobs_imported", rep.blobs_imported},
                    {"blobs_cached", rep.blobs_cached},
                    {"bytes_imported", rep.bytes_imported},
                    {"refs", list},
                    {"warnings", rep.warnings}});
    return 0;
  }
  ctx.say(fmt::format(
      "imported {} ref{} from {} into {} ({} blob{} verified and stored, {}; {} "
      "already cached)",
      rep.refs.size(), rep.refs.size() == 1 ? "" : "s", rep.dir.string(),
      ctx.store().root().string(), rep.blobs_imported, rep.blobs_imported == 1 ? "" : "s",
      human_bytes(rep.bytes_imported), rep.blobs_cached));
  for (auto& r : rep.refs)
    ctx.say(fmt::format("  {}@{} {}: {}/{} variants complete, {} signature{}", r.repo,
                        r.tag.empty() ? r.index.str() : r.tag, r.index.str(), r.variants_complete,
                        r.variants_total, r.signatures, r.signatures == 1 ? "" : "s"));
  if (!rep.source_hub_id.empty())
    ctx.say(
        fmt::format("refs recorded for {} and {}: offline loads against {} (or --hub {}) "
                    "resolve from the cache",
                    rep.source_hub_id, rep.mirror_hub_id,
                    rep.source.empty() ? rep.source_hub_id : rep.source, rep.dir.string()));
  return 0;
}

}  // namespace

void add_mirror_commands(CLI::App& app, Runner& run) {
  {
    auto* cmd = app.add_subcommand(
        "export",
        "Write an offline mirror: an OCI layout hub directory (DIR/ORG/NAME/, like the embedded "
        "default hub) with what a KernelConfig or lock file needs from the current hub, plus "
        "DIR/kernel-hub-mirror.json. Everything is pulled into the cache first, then written "
        "from it. Each index is kept byte for byte (its signatures stay valid) with every "
        "variant manifest; only the chosen variants' blobs travel (--all-variants: every "
        "variant's). Written to a temp directory beside DIR and renamed into place. Serve it "
        "with --hub DIR, or load it into a cache with `kernel-hub import DIR`. Example: "
        "kernel-hub export --config kernels.json --target cpu --target cuda:sm_90:cuda_13.0 "
        "-o /media/usb/kernels");
    auto a = std::make_shared<ExportArgs>();
    cmd->add_option("--config", a->config, "KernelConfig JSON file");
    cmd->add_option("--lock", a->lock,
                    "Lock file (kernel-hub lock): export exactly its digests and targets");
    a->dev.add(cmd);
    cmd->add_option("-o,--output", a->out, "Mirror directory to write (missing or empty)")
        ->required();
    cmd->add_flag("--all-variants", a->all_variants,
                  "Every variant's blobs, for any device (a full mirror of each ref)");
    cmd->add_flag("--force", a->force,
                  "Replace an existing mirror at DIR (only a directory holding "
                  "kernel-hub-mirror.json)");
    cmd->callback([&run, a] { run = [a](Context& ctx) { return run_export(ctx, *a); }; });
  }
  {
    auto* cmd = app.add_subcommand(
        "import",
        "Fill the cache from an offline mirror (kernel-hub export) or any layout hub directory, "
        "with no network (works with --offline): indexes, variant manifests, the blobs present "
        "(each verified; a damaged one fails the import naming it, and nothing is recorded) "
        "and signature sets (nothing is unpacked before a load checks the signature). Refs are "
        "recorded under the directory's hub id "
        "and under the hub the mirror was exported from, so offline loads against the original "
        "hub address (and lock files made there) resolve from the cache. Signatures are checked "
        "when a package is loaded, as for any other.");
    auto dir = std::make_shared<std::string>();
    cmd->add_option("dir", *dir, "Mirror directory")->required();
    cmd->callback([&run, dir] { run = [dir](Context& ctx) { return run_import(ctx, *dir); }; });
  }
}

}  // namespace kh::cli
