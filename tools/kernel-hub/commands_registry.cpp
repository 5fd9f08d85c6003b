// resolve, why, lock, pack, and the registry half of pull (--config, --lock): the commands that
// join the hub to KernelConfigs, devices and the loader.
//
// Devices, everywhere: --device cpu|cuda [--sm 90] [--cuda 13.0] [--os linux] [--arch amd64]
// describes one device by hand (cuda needs --sm and --cuda; the default is this machine's cpu).
// lock and pull take several targets: repeat --target SPEC with SPEC = cpu, cpu:OS/ARCH,
// cuda:sm_90:cuda_13.0 or cuda:sm_90:cuda_13.0:OS/ARCH; a --device group adds one more.
#include <fmt/format.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>

#include <iostream>
#include <map>
#include <memory>

#include "hub/base/error.h"
#include "registry/kernel_config.h"
#include "registry/kernelize.h"
#include "registry/lock_file.h"
#include "registry/pack.h"
#include "registry/resolver.h"
#include "tools/kernel-hub/cli.h"

namespace kh::cli {

namespace {

struct DeviceArgs {
  std::string key, sm, cuda, os, arch;
  std::vector<std::string> targets;

  void add(CLI::App* cmd, bool with_targets) {
    cmd->add_option("--device", key,
                    "cpu (default: this machine), cuda:N (GPU N of this machine, read from the "
                    "driver) or cuda with --sm and --cuda (any GPU, described by hand)");
    cmd->add_option("--sm", sm, "cuda: compute capability, e.g. 90 (H100/H200), 80, 89");
    cmd->add_option("--cuda", cuda, "cuda: the CUDA version the driver supports, e.g. 13.0");
    cmd->add_option("--os", os, "OCI platform os (default: this machine's)");
    cmd->add_option("--arch", arch,
                    "OCI platform architecture, e.g. amd64, arm64 (default: this "
                    "machine's)");
    if (with_targets)
      cmd->add_option("--target", targets,
                      "A target device, repeatable: cpu, cpu:OS/ARCH, cuda:sm_90:cuda_13.0 or "
                      "cuda:sm_90:cuda_13.0:OS/ARCH");
  }

  bool has_group() const {
    return !key.empty() || !sm.empty() || !cuda.empty() || !os.empty() || !arch.empty();
  }

  Device group() const {
    DeviceFields f;
    f.key = key.empty() ? (sm.empty() && cuda.empty() ? "cpu" : "cuda") : key;
    if (!sm.empty()) f.sm = sm;
    if (!cuda.empty()) f.cuda = cuda;
    if (!os.empty()) f.os = os;
    if (!arch.empty()) f.arch = arch;
    return make_device(f);
  }

  // One device (resolve, why, pull --config): the group, else the one --target, else local cpu.
  Device one() const {
    if (!targets.empty() && !has_group() && targets.size() == 1)
      return parse_device_target(targets[0]);
    if (!targets.empty())
      throw Error(ErrorKind::kInvalidInput,
                  "give one device: either --device/--sm/--cuda or a single --target");
    return has_group() ? group() : local_cpu_device();
  }

  // Every target (lock): --target specs, then the --device group; default local cpu.
  std::vector<Device> all() const {
    std::vector<Device> out;
    for (auto& t : targets) out.push_back(parse_device_target(t));
    if (has_group() || out.empty()) out.push_back(has_group() ? group() : local_cpu_device());
    return out;
  }
};

std::vector<Mode> modes_of(const std::string& mode) {
  if (mode.empty()) return {Mode::kEval, Mode::kTrain};
  auto m = parse_mode_key(mode);
  if (!m || m->is_fallback())
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("--mode '{}': expected eval or train (default: both)", mode));
  return {*m->mode()};
}

// A hub that asks for every tag (no ref TTL): lock and pull must see what the hub serves now.
std::unique_ptr<Hub> fresh_hub(Context& ctx) {
  HubOptions o = ctx.hub_options();
  o.ref_ttl_s = 0;
  return std::make_unique<Hub>(ctx.hub().address(), ctx.store(), o);
}

nlohmann::json trace_json(const std::vector<TraceStep>& trace) {
  nlohmann::json a = nlohmann::json::array();
  for (auto& s : trace)
    a.push_back({{"stage", trace_stage_name(s.stage)},
                 {"candidate", s.candidate},
                 {"accepted", s.accepted},
                 {"reason", s.reason}});
  return a;
}

nlohmann::json layer_json(const LayerResolution& r, bool with_trace) {
  nlohmann::json j = {{"layer", r.layer},
                      {"mode", mode_name(r.requested)},
                      {"fallback", r.fallback},
                      {"summary", r.summary()}};
  if (!r.unserved.empty()) j["unserved"] = r.unserved;
  if (!r.fallback) {
    j["kernel"] = r.kernel.str();
    j["entry_mode"] = mode_key_name(r.entry_mode);
    j["entry_path"] = r.entry_path;
    j["hub"] = r.hub_id;
    j["index_digest"] = r.index_digest.str();
    if (r.variant) {
      j["variant"] = {{"position", r.variant->position},
                      {"digest", r.variant->descriptor.digest.str()},
                      {"code", variant_code_name(r.variant->code)},
                      {"cubin_sm", r.variant->cubin_sm},
                      {"cuda_version", r.variant->cuda_version}};
    }
    if (r.package_layer)
      j["package_layer"] = {{"digest", r.package_layer->digest.str()},
                            {"size", r.package_layer->size}};
  }
  if (with_trace) j["trace"] = trace_json(r.trace);
  return j;
}

// The config's notes (device keys skipped here, lowercased repository names, ...) on stderr.
void show_config_notes(Context& ctx, const KernelConfig& config) {
  for (auto& n : config.notes) ctx.note("note: " + n);
}

// Local package directories the config names by path (Transformers' use_local_kernel form), then
// KERNEL_HUB_LOCAL's, served to resolve and why as kernelize serves them.
void add_local_packages(KernelizeIndexProvider& provider, const KernelConfig& config,
                        const Device& device) {
  std::map<std::string, std::filesystem::path> dirs;
  if (const char* env = std::getenv("KERNEL_HUB_LOCAL"); env && *env)
    dirs = parse_local_overrides(env);
  for (auto& [repo, dir] : config.local_packages) dirs.emplace(repo, dir);
  for (auto& ref : config.refs()) {
    auto it = dirs.find(ref.repo);
    if (it != dirs.end() && !provider.local().find(ref))
      provider.local().add(ref.repo, it->second, device, ResolveOptions{});
  }
}

// The --strict failure: a line per unserved entry, exit 1. `json_error`: print the --json error
// object too (resolve has printed its report, whose "unserved" says the same, so it passes false
// and stdout stays one JSON document).
int fail_strict(std::string_view command, const std::vector<std::string>& unserved,
                bool json_error) {
  std::string message = fmt::format(
      "{} --strict: {} config entr{} cannot be served (each falls back to the runtime's own "
      "implementation):",
      command, unserved.size(), unserved.size() == 1 ? "y" : "ies");
  for (auto& u : unserved) message += "\n  " + u;
  print_error(json_error, error_kind_name(ErrorKind::kNotFound), message);
  return 1;
}

int run_resolve(Context& ctx, const std::string& config_path, const DeviceArgs& dev,
                const std::string& mode, bool strict) {
  KernelConfig config = KernelConfig::load(config_path);
  show_config_notes(ctx, config);
  Device device = dev.one();
  KernelizeIndexProvider provider(ctx.hub());
  add_local_packages(provider, config, device);
  nlohmann::json out = {{"config", config_path}, {"device", device.str()}};
  nlohmann::json modes = nlohmann::json::array();
  std::vector<std::string> unserved;
  for (Mode m : modes_of(mode)) {
    Resolution r = resolve(config, device, m, provider);
    nlohmann::json layers = nlohmann::json::array();
    ctx.say(fmt::format("{} on {}:", mode_name(m), device.describe()));
    for (auto& l : r.layers) {
      layers.push_back(layer_json(l, false));
      ctx.say("  " + l.summary() + (l.fallback ? "" : "  index " + l.index_digest.str()));
      if (l.unserved.empty()) continue;
      unserved.push_back(fmt::format("{} {}: {}", l.layer, mode_name(m), l.unserved));
      if (!strict) ctx.warn("unserved: " + unserved.back());
    }
    modes.push_back({{"mode", mode_name(m)}, {"layers", layers}});
  }
  out["modes"] = modes;
  out["unserved"] = unserved;
  out["notes"] = config.notes;
  if (ctx.options().json) ctx.print_json(out);
  if (strict && !unserved.empty()) return fail_strict("resolve", unserved, false);
  return 0;
}

int run_why(Context& ctx, const std::string& layer, const std::string& config_path,
            const DeviceArgs& dev, const std::string& mode) {
  KernelConfig config = KernelConfig::load(config_path);
  show_config_notes(ctx, config);
  Device device = dev.one();
  KernelizeIndexProvider provider(ctx.hub());
  add_local_packages(provider, config, device);
  MemoIndexProvider memo(provider);
  nlohmann::json modes = nlohmann::json::array();
  for (Mode m : modes_of(mode)) {
    LayerResolution r = resolve_layer(config, layer, device, m, memo);
    modes.push_back(layer_json(r, true));
    ctx.say(format_trace(r));
  }
  if (ctx.options().json)
    ctx.print_json({{"layer", layer}, {"device", device.str()}, {"modes", modes}});
  return 0;
}

int run_lock(Context& ctx, const std::string& config_path, const DeviceArgs& dev,
             const std::string& out_path, bool strict) {
  KernelConfig config = KernelConfig::load(config_path);
  show_config_notes(ctx, config);
  std::vector<Device> devices = dev.all();
  auto hub = fresh_hub(ctx);
  KernelizeIndexProvider provider(*hub);
  LockBuild built = build_lock(config, devices, provider);
  // A ref without a variant for a target is always an error (kernelize under the lock would
  // fail there); an entry that cannot be served at all is left out with a warning, or with
  // --strict fails the lock.
  built.require_complete("lock", out_path, false);
  if (strict && !built.unserved.empty())
    return fail_strict("lock", built.unserved, ctx.options().json);
  for (auto& u : built.unserved) ctx.warn("unserved (not locked): " + u);
  built.lock.save(out_path);
  size_t targets = 0;
  for (auto& e : built.lock.entries) targets += e.targets.size();
  if (ctx.options().json) {
    ctx.print_json({{"lock", out_path},
                    {"entries", nlohmann::json::parse(built.lock.serialize())["entries"]},
                    {"unserved", built.unserved},
                    {"devices", [&] {
                       nlohmann::json a = nlohmann::json::array();
                       for (auto& d : devices) a.push_back(d.str());
                       return a;
                     }()}});
  } else {
    ctx.say(fmt::format("locked {} ref{} ({} variant{} for {} target{}) in {}",
                        built.lock.entries.size(), built.lock.entries.size() == 1 ? "" : "s",
                        targets, targets == 1 ? "" : "s", devices.size(),
                        devices.size() == 1 ? "" : "s", out_path));
    for (auto& e : built.lock.entries) {
      ctx.say(fmt::format("  {} {}", e.ref.str(), e.index_digest.str()));
      for (auto& [d, t] : e.targets)
        ctx.say(fmt::format("    {}: variant {}", d, t.manifest_digest.str()));
    }
  }
  return 0;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(start, comma - start);
    if (!item.empty()) out.push_back(item);
    start = comma + 1;
  }
  return out;
}

struct PackArgs {
  std::string dir, out, repo, sm = "80,86,89,90,90a", devices = "cuda,cpu", cuda_version;
  std::vector<std::string> tags;
  bool no_source = false;
  std::string sign_key, sign_repo, hub_id = "kernel-hub", expires_in = "90d";
};

int run_pack(Context& ctx, const PackArgs& a) {
  PackOptions o;
  o.package_dir = a.dir;
  o.output = a.out;
  o.repo = a.repo;
  o.sms = split_list(a.sm);
  o.tags = a.tags;
  o.devices = split_list(a.devices);
  o.cuda_version = a.cuda_version;
  o.include_source = !a.no_source;
  std::optional<trust::PrivateKey> key;
  if (!a.sign_key.empty()) {
    key = trust::PrivateKey::load(a.sign_key);
    o.sign_key = &*key;
    o.sign_repo = a.sign_repo;
    o.sign_hub_id = a.hub_id;
    o.sign_expires =
        static_cast<int64_t>(std::time(nullptr)) + parse_duration(a.expires_in, "--expires-in");
  }
  PackReport r = pack_package(o);
  for (auto& n : r.notes) ctx.warn(n);
  if (ctx.options().json) {
    nlohmann::json variants = nlohmann::json::array();
    for (auto& v : r.variants)
      variants.push_back({{"device", v.device},
                          {"manifest_digest", v.entry.digest.str()},
                          {"annotations", v.entry.annotations},
                          {"layer_digest", v.layer.digest.str()},
                          {"layer_size", v.layer.size},
                          {"files", v.files}});
    ctx.print_json({{"name", r.name},
                    {"version", r.version},
                    {"layout", r.layout.string()},
                    {"index_digest", r.index.digest.str()},
                    {"tags", r.tags},
                    {"signed", r.signed_statements.size()},
                    {"variants", variants}});
    return 0;
  }
  std::string tags;
  for (auto& t : r.tags) tags += (tags.empty() ? "" : ", ") + t;
  ctx.say(fmt::format("packed {} {} into {} (tags {}): index {}", r.name, r.version,
                      r.layout.string(), tags, r.index.digest.str()));
  for (auto& v : r.variants) {
    std::string extra;
    for (auto& [k, val] : v.entry.annotations) extra += fmt::format(" {}={}", k, val);
    ctx.say(fmt::format("  {} {} ({}, {} files):{}", v.device, v.entry.digest.str(),
                        human_bytes(static_cast<uint64_t>(v.layer.size)), v.files.size(), extra));
  }
  for (auto& st : r.signed_statements)
    ctx.say(fmt::format("  signed {}@{} (hub id {}, serial {}, expires {})", st.repo, st.tag,
                        st.hub_id, st.serial, trust::format_time_rfc3339(st.expires)));
  return 0;
}

nlohmann::json fetched_json(const std::string& ref, const std::string& target,
                            const Digest& manifest, const Digest& layer, bool fetched) {
  return {{"ref", ref},
          {"target", target},
          {"manifest_digest", manifest.str()},
          {"layer_digest", layer.str()},
          {"fetched", fetched}};
}

// Fetches every target of a lock (or of a lock built on the fly for pull --config).
int fetch_lock_targets(Context& ctx, Hub& hub, const LockFile& lock, nlohmann::json& out) {
  int failures = 0;
  for (auto& e : lock.entries) {
    // The index's signatures come along, so that an offline load can check them.
    if (!hub.options().offline) hub.signatures(e.ref.repo, e.index_digest, true);
    for (auto& [target, t] : e.targets) {
      try {
        bool fetched = false;
        fetch_lock_target(hub, e.ref.repo, t, &fetched);  // cached, not unpacked (a load does)
        out.push_back(
            fetched_json(e.ref.str(), target, t.manifest_digest, t.layer_digest, fetched));
        ctx.say(fmt::format("{} {}: {} ({})", e.ref.str(), target, t.manifest_digest.str(),
                            fetched ? "fetched" : "cached"));
      } catch (const Error& err) {
        ++failures;
        out.push_back(
            {{"ref", e.ref.str()},
             {"target", target},
             {"error", {{"kind", error_kind_name(err.kind())}, {"message", err.what()}}}});
        std::cerr << "error: " << err.what() << "\n";
      }
    }
  }
  return failures;
}

}  // namespace

// pull --config / --lock (declared in commands_hub.cpp, which owns the pull command).
int run_pull_resolved(Context& ctx, const std::string& config_path, const std::string& lock_path,
                      const std::vector<std::string>& targets, const std::string& device_key,
                      const std::string& sm, const std::string& cuda, bool all_variants) {
  nlohmann::json out = nlohmann::json::array();
  int failures = 0;
  auto hub = fresh_hub(ctx);
  if (!lock_path.empty()) {
    if (!config_path.empty())
      throw Error(ErrorKind::kInvalidInput, "pull: give --config or --lock, not both");
    LockFile lock = LockFile::load(lock_path);
    for (auto& e : lock.entries) {
      if (e.hub != hub->address().id())
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("pull --lock {}: {} was locked on hub {}, but this pull uses {}; "
                                "pass --hub for that hub or re-run kernel-hub lock",
                                lock_path, e.ref.str(), e.hub, hub->address().id()));
      // The index and its variant manifests, by the locked digest (offline kernelize under the
      // lock resolves from exactly these).
      hub->info(Ref{e.ref.repo, "", e.index_digest});
    }
    failures = fetch_lock_targets(ctx, *hub, lock, out);
  } else {
    KernelConfig config = KernelConfig::load(config_path);
    if (all_variants) {
      for (auto& ref : config.refs()) {
        try {
          PullReport r = hub->pull(ref);
          out.push_back({{"ref", ref.str()},
                         {"digest", r.digest.str()},
                         {"manifests", r.manifests},
                         {"blobs_downloaded", r.blobs_downloaded}});
          ctx.say(fmt::format("{} {} (every variant: {} manifests, downloaded {})", ref.str(),
                              r.digest.str(), r.manifests, human_bytes(r.bytes_downloaded)));
        } catch (const Error& err) {
          ++failures;
          out.push_back(
              {{"ref", ref.str()},
               {"error", {{"kind", error_kind_name(err.kind())}, {"message", err.what()}}}});
          std::cerr << "error: " << err.what() << "\n";
        }
      }
    } else {
      DeviceArgs dev;
      dev.targets = targets;
      dev.key = device_key;
      dev.sm = sm;
      dev.cuda = cuda;
      KernelizeIndexProvider provider(*hub);
      LockBuild built = build_lock(config, dev.all(), provider);
      for (auto& u : built.unserved) ctx.warn("unserved (not pulled): " + u);
      for (auto& m : built.misses) {
        ++failures;
        out.push_back({{"error", {{"kind", "not_found"}, {"message", m}}}});
        std::cerr << "error: " << m << "\n";
      }
      failures += fetch_lock_targets(ctx, *hub, built.lock, out);
    }
  }
  if (ctx.options().json) ctx.print_json(out);
  return failures == 0 ? 0 : 1;
}

void add_registry_commands(CLI::App& app, Runner& run) {
  {
    auto* cmd = app.add_subcommand(
        "resolve",
        "Show which kernel serves each layer of a KernelConfig on a device, per mode (eval, "
        "train), with the index and variant chosen. Use `why LAYER` for the reasons.");
    auto config = std::make_shared<std::string>();
    auto dev = std::make_shared<DeviceArgs>();
    auto mode = std::make_shared<std::string>();
    auto strict = std::make_shared<bool>(false);
    cmd->add_option("--config", *config, "KernelConfig JSON file")->required();
    dev->add(cmd, true);
    cmd->add_option("--mode", *mode, "eval or train (default: both)");
    cmd->add_flag("--strict", *strict,
                  "Exit 1 when a layer the config maps on the device cannot be served (not on "
                  "this hub, no such tag, a revision that is not a tag or digest, the package "
                  "lacks the layer, no variant fits); without it each is a warning");
    cmd->callback([&run, config, dev, mode, strict] {
      run = [=](Context& ctx) { return run_resolve(ctx, *config, *dev, *mode, *strict); };
    });
  }
  {
    auto* cmd = app.add_subcommand(
        "why",
        "Explain the resolution of one layer: every capability range, mode entry and variant "
        "considered, accepted or rejected, with the reason.");
    auto layer = std::make_shared<std::string>();
    auto config = std::make_shared<std::string>();
    auto dev = std::make_shared<DeviceArgs>();
    auto mode = std::make_shared<std::string>();
    cmd->add_option("layer", *layer, "Layer type, e.g. RMSNorm")->required();
    cmd->add_option("--config", *config, "KernelConfig JSON file")->required();
    dev->add(cmd, true);
    cmd->add_option("--mode", *mode, "eval or train (default: both)");
    cmd->callback([&run, layer, config, dev, mode] {
      run = [=](Context& ctx) { return run_why(ctx, *layer, *config, *dev, *mode); };
    });
  }
  {
    auto* cmd = app.add_subcommand(
        "lock",
        "Pin every ref of a KernelConfig to its index digest and, per target device, the chosen "
        "variant manifest and package layer. Targets: repeat --target SPEC (cpu, cpu:OS/ARCH, "
        "cuda:sm_90:cuda_13.0[:OS/ARCH]); a --device/--sm/--cuda group adds one more; default: "
        "this machine's cpu. Example: kernel-hub lock --config k.json --target "
        "cuda:sm_90:cuda_13.0 --target cuda:sm_80:cuda_13.0 --target cpu -o kernels.lock");
    auto config = std::make_shared<std::string>();
    auto dev = std::make_shared<DeviceArgs>();
    auto out = std::make_shared<std::string>();
    auto strict = std::make_shared<bool>(false);
    cmd->add_option("--config", *config, "KernelConfig JSON file")->required();
    dev->add(cmd, true);
    cmd->add_option("-o,--output", *out, "Lock file to write (e.g. kernels.lock)")->required();
    cmd->add_flag("--strict", *strict,
                  "Write nothing and exit 1 when a config entry cannot be served (not on this "
                  "hub, no such tag, a revision that is not a tag or digest, the package lacks "
                  "the layer); without it each is a warning and left out of the lock. A ref with "
                  "no variant for a --target always fails");
    cmd->callback([&run, config, dev, out, strict] {
      run = [=](Context& ctx) { return run_lock(ctx, *config, *dev, *out, *strict); };
    });
  }
  {
    auto* cmd = app.add_subcommand(
        "pack",
        "Pack a built kernel package directory (host library, kernel.json, .cu source) into an "
        "OCI image layout: loader preflight of the host library, NVRTC cubin per sm (no GPU "
        "needed), kernel.json with every file's SHA-256, one tar+zstd variant per device, an "
        "image index tagged with the channel (v<major>) and the exact version. Reproducible. "
        "Publish with `kernel-hub push LAYOUT org/name@v1`.");
    auto a = std::make_shared<PackArgs>();
    cmd->add_option("dir", a->dir, "Built package directory")->required();
    cmd->add_option("-o,--output", a->out,
                    "OCI image layout directory to write (created if needed)")
        ->required();
    cmd->add_option("--repo", a->repo,
                    "Write into a layout hub: the layout goes to OUTPUT/ORG/NAME (as the "
                    "embedded default hub)");
    cmd->add_option("--sm", a->sm,
                    "Comma list of targets to compile cubins for (default 80,86,89,90,90a; '' = "
                    "source only)");
    cmd->add_option("--tag", a->tags,
                    "Channel tag, repeatable (default v<major>); the exact version is always "
                    "tagged too");
    cmd->add_option("--devices", a->devices, "Comma list of variants: cuda, cpu (default both)");
    cmd->add_option("--cuda-version", a->cuda_version,
                    "CUDA version the cuda variant needs (default: NVRTC's when cubins are "
                    "compiled, else kernel.json's cuda.version, else 12.0)");
    cmd->add_flag("--no-source", a->no_source, "Leave the .cu source out of the cuda variant");
    cmd->add_option("--sign", a->sign_key,
                    "Sign every tag with this private key (kernel-hub keygen); the envelopes go "
                    "to signatures/ in the layout and travel with `kernel-hub push`");
    cmd->add_option("--sign-repo", a->sign_repo,
                    "Repo the statements bind (default: --repo, else kernel.json's name)");
    cmd->add_option("--hub-id", a->hub_id, "Hub id the statements name")->capture_default_str();
    cmd->add_option("--expires-in", a->expires_in, "Signature validity (e.g. 90d)")
        ->capture_default_str();
    cmd->callback([&run, a] { run = [a](Context& ctx) { return run_pack(ctx, *a); }; });
  }
}

}  // namespace kh::cli
