// pull, push, info, versions: the commands that talk to a hub.
#include <fmt/format.h>

#include <iostream>

#include "hub/base/error.h"
#include "registry/versions.h"
#include "tools/kernel-hub/cli.h"

namespace kh::cli {

// pull --config / --lock: in commands_registry.cpp (it needs the registry).
int run_pull_resolved(Context& ctx, const std::string& config_path, const std::string& lock_path,
                      const std::vector<std::string>& targets, const std::string& device_key,
                      const std::string& sm, const std::string& cuda, bool all_variants);

namespace {

struct PullArgs {
  std::vector<std::string> refs;
  bool all_variants = false;
  std::string config, lock, device, sm, cuda;
  std::vector<std::string> targets;
};

nlohmann::json pull_json(const PullReport& r) {
  return {{"ref", r.ref.str()},
          {"digest", r.digest.str()},
          {"media_type", r.media_type},
          {"manifests", r.manifests},
          {"blobs", r.blobs},
          {"blobs_downloaded", r.blobs_downloaded},
          {"bytes_downloaded", r.bytes_downloaded},
          {"total_bytes", r.total_bytes},
          {"from_cache", r.from_cache}};
}

// Pull only caches: it never runs package code, so an untrusted ref is reported, not refused.
// kernelize refuses it before anything is loaded.
nlohmann::json trust_summary(Hub& hub, const Ref& ref, const Digest& index) {
  try {
    trust::TrustDecision d = hub.check_trust(ref, index, default_trust_store());
    if (!d.signed_ok) return {{"status", "unsigned-allowed"}, {"message", d.warning}};
    return {{"status", "signed"},
            {"keyid", d.key_id},
            {"serial", d.serial},
            {"expires", trust::format_time_rfc3339(d.expires)},
            {"message", fmt::format("signed by key {} (serial {}, expires {}){}", d.key_id,
                                    d.serial, trust::format_time_rfc3339(d.expires),
                                    d.in_grace ? ": " + d.warning : "")}};
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kRefused) throw;
    return {{"status", "refused"}, {"message", e.what()}};
  }
}

bool has_device_args(const PullArgs& a) {
  return !a.targets.empty() || !a.device.empty() || !a.sm.empty() || !a.cuda.empty();
}

int run_pull(Context& ctx, const PullArgs& a) {
  if (!a.config.empty() || !a.lock.empty()) {
    if (!a.refs.empty())
      throw Error(ErrorKind::kInvalidInput,
                  "pull: give refs, or --config FILE, or --lock FILE (one of them)");
    // A lock pins its targets and --all-variants takes every one: devices would be ignored, and
    // a pull that fetched other targets than asked for without a word is worse than a refusal.
    if (has_device_args(a) && (!a.lock.empty() || a.all_variants))
      throw Error(
          ErrorKind::kInvalidInput,
          fmt::format("pull: --device/--sm/--cuda/--target cannot be combined with {}: "
                      "{}; leave the device options out",
                      a.lock.empty() ? "--all-variants" : "--lock",
                      a.lock.empty() ? "it fetches every variant of every ref"
                                     : "it fetches exactly the targets the lock file pins"));
    return run_pull_resolved(ctx, a.config, a.lock, a.targets, a.device, a.sm, a.cuda,
                             a.all_variants);
  }
  if (a.refs.empty())
    throw Error(ErrorKind::kInvalidInput,
                "pull: nothing to pull; give refs (org/name[@TAG]), --config FILE or --lock FILE");
  if (has_device_args(a))
    throw Error(ErrorKind::kInvalidInput,
                "pull: --device/--sm/--cuda/--target choose variants for --config; a plain "
                "`pull REF` fetches every variant");
  std::vector<Ref> parsed;
  for (auto& text : a.refs) parsed.push_back(Ref::parse(text));  // all valid before any I/O
  // An explicit pull always asks the hub for tags (it is how a cache is refreshed): no ref TTL.
  HubOptions options = ctx.hub_options();
  options.ref_ttl_s = 0;
  Hub hub(ctx.hub().address(), ctx.store(), options);
  nlohmann::json out = nlohmann::json::array();
  int failures = 0;
  for (auto& ref : parsed) {
    try {
      PullReport r = hub.pull(ref);
      nlohmann::json j = pull_json(r);
      if (r.kernel_index) j["trust"] = trust_summary(hub, ref, r.digest);
      out.push_back(j);
      ctx.say(fmt::format("{} {} ({} manifest{}, {} blob{}, {}; downloaded {}{})", ref.str(),
                          r.digest.str(), r.manifests, r.manifests == 1 ? "" : "s", r.blobs,
                          r.blobs == 1 ? "" : "s", human_bytes(r.total_bytes),
                          human_bytes(r.bytes_downloaded), r.from_cache ? ", offline" : ""));
      if (!r.kernel_index) {
      } else if (j["trust"]["status"] == "refused")
        ctx.warn(j["trust"]["message"].get<std::string>() +
                 " (pulled into the cache; loading it will be refused)");
      else if (!ctx.options().json)
        ctx.say("  " + j["trust"]["message"].get<std::string>());
    } catch (const Error& caught) {
      // A tag the hub does not have: the error lists the versions it does have.
      Error e = ref.digest ? caught : with_versions_hint(caught, hub, ref.repo);
      ++failures;
      out.push_back({{"ref", ref.str()},
                     {"error", {{"kind", error_kind_name(e.kind())}, {"message", e.what()}}}});
      std::cerr << "error: " << e.what() << "\n";
    }
  }
  if (ctx.options().json) ctx.print_json(out);
  return failures == 0 ? 0 : 1;
}

int run_push(Context& ctx, const std::string& dir, const std::string& ref_text) {
  Ref ref = Ref::parse(ref_text);
  PushReport r = ctx.hub().push(dir, ref);
  if (ctx.options().json) {
    ctx.print_json({{"ref", ref.str()},
                    {"digest", r.digest.str()},
                    {"blobs_uploaded", r.blobs_uploaded},
                    {"blobs_skipped", r.blobs_skipped},
                    {"bytes_uploaded", r.bytes_uploaded}});
  } else {
    ctx.say(fmt::format("pushed {} {} to {} ({} blob{} uploaded, {} already there, {})", ref.str(),
                        r.digest.str(), ctx.hub().address().text, r.blobs_uploaded,
                        r.blobs_uploaded == 1 ? "" : "s", r.blobs_skipped,
                        human_bytes(r.bytes_uploaded)));
  }
  return 0;
}

std::string platform_text(const oci::Descriptor& d) {
  if (!d.platform) return "-";
  return d.platform->os + "/" + d.platform->architecture +
         (d.platform->variant.empty() ? "" : "/" + d.platform->variant);
}

RefInfo info_listing_versions(Hub& hub, const Ref& ref) {
  try {
    return hub.info(ref);
  } catch (const Error& e) {
    if (ref.digest) throw;
    throw with_versions_hint(e, hub, ref.repo);
  }
}

int run_versions(Context& ctx, const std::string& text, size_t limit) {
  if (text.find('@') != std::string::npos)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("versions {}: give ORG/NAME without @TAG (it lists every tag)", text));
  std::string repo = Ref::parse(text).repo;
  VersionList list = VersionList::from_tags(ctx.hub().tags(repo));
  if (ctx.options().json) {
    ctx.print_json({{"repo", repo},
                    {"hub", ctx.hub().address().text},
                    {"channels", list.channels},
                    {"versions", list.versions},
                    {"other", list.other},
                    {"tags", list.all()}});
    return 0;
  }
  auto line = [&](const char* label, const std::vector<std::string>& tags) {
    VersionList one;
    one.other = tags;
    ctx.say(fmt::format("  {:<9} {}", label, format_versions(one, limit ? limit : tags.size())));
  };
  ctx.say(fmt::format("{} on {} ({} tag{})", repo, ctx.hub().address().text, list.size(),
                      list.size() == 1 ? "" : "s"));
  line("channels:", list.channels);
  line("versions:", list.versions);
  if (!list.other.empty()) line("other:", list.other);
  return 0;
}

int run_info(Context& ctx, const std::string& ref_text) {
  Ref ref = Ref::parse(ref_text);
  RefInfo info = info_listing_versions(ctx.hub(), ref);
  if (ctx.options().json) {
    nlohmann::json variants = nlohmann::json::array();
    for (auto& v : info.variants) {
      nlohmann::json layers = nlohmann::json::array();
      for (auto& l : v.manifest.layers) {
        layers.push_back({{"media_type", l.media_type},
                          {"digest", l.digest.str()},
                          {"size", l.size},
                          {"annotations", l.annotations}});
      }
      variants.push_back({{"digest", v.descriptor.digest.str()},
                          {"platform", platform_text(v.descriptor)},
                          {"annotations", v.descriptor.annotations},
                          {"artifact_type", v.manifest.artifact_type},
                          {"layers", layers}});
    }
    ctx.print_json({{"ref", ref.str()},
                    {"digest", info.digest.str()},
                    {"media_type", info.media_type},
                    {"artifact_type", info.artifact_type},
                    {"annotations", info.annotations},
                    {"from_cache", info.from_cache},
                    {"variants", variants}});
    return 0;
  }
  ctx.say(fmt::format("{}\n  digest:        {}\n  media type:    {}\n  artifact type: {}",
                      ref.str(), info.digest.str(), info.media_type,
                      info.artifact_type.empty() ? "-" : info.artifact_type));
  for (auto& [k, v] : info.annotations) ctx.say(fmt::format("  {} = {}", k, v));
  ctx.say(fmt::format("  variants: {}", info.variants.size()));
  for (auto& v : info.variants) {
    uint64_t size = 0;
    for (auto& l : v.manifest.layers) size += static_cast<uint64_t>(l.size);
    ctx.say(fmt::format("  - {} {} ({} layer{}, {})", platform_text(v.descriptor),
                        v.descriptor.digest.str(), v.manifest.layers.size(),
                        v.manifest.layers.size() == 1 ? "" : "s", human_bytes(size)));
    for (auto& [k, val] : v.descriptor.annotations) ctx.say(fmt::format("      {} = {}", k, val));
  }
  return 0;
}

}  // namespace

void add_hub_commands(CLI::App& app, Runner& run) {
  auto* pull = app.add_subcommand(
      "pull",
      "Fetch into the cache and verify: refs (index, every variant manifest and blob); or what "
      "a KernelConfig needs on a device (--config FILE, only the matching variants; devices as "
      "for lock: --device/--sm/--cuda or repeated --target SPEC; --all-variants for mirrors); "
      "or exactly the digests of a lock file (--lock FILE)");
  auto a = std::make_shared<PullArgs>();
  pull->add_option("refs", a->refs, "org/name[@TAG|@sha256:HEX] (default tag v1)");
  pull->add_option("--config", a->config, "KernelConfig JSON file: pull what it needs");
  pull->add_option("--lock", a->lock, "Lock file: pull exactly its digests, every target");
  pull->add_option(
      "--device", a->device,
      "--config: cpu (default), cuda:N (GPU N, read from the driver) or cuda with --sm and --cuda");
  pull->add_option("--sm", a->sm, "--config: compute capability, e.g. 90");
  pull->add_option("--cuda", a->cuda, "--config: driver CUDA version, e.g. 13.0");
  pull->add_option("--target", a->targets,
                   "--config: a target device, repeatable (cpu, cuda:sm_90:cuda_13.0[:OS/ARCH])");
  pull->add_flag("--all-variants", a->all_variants,
                 "--config: every variant of every ref (mirrors); plain refs always get every "
                 "variant");
  pull->callback([&run, a] { run = [a](Context& ctx) { return run_pull(ctx, *a); }; });

  auto* push = app.add_subcommand(
      "push", "Upload the index tagged in an OCI layout DIR (or its only one) to REF on the hub");
  auto dir = std::make_shared<std::string>();
  auto push_ref = std::make_shared<std::string>();
  push->add_option("dir", *dir, "OCI image layout directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  push->add_option("ref", *push_ref, "destination org/name[@TAG]")->required();
  push->callback([&run, dir, push_ref] {
    run = [dir, push_ref](Context& ctx) { return run_push(ctx, *dir, *push_ref); };
  });

  auto* info = app.add_subcommand("info", "Show a ref's index and variants");
  auto info_ref = std::make_shared<std::string>();
  info->add_option("ref", *info_ref, "org/name[@TAG|@sha256:HEX]")->required();
  info->callback(
      [&run, info_ref] { run = [info_ref](Context& ctx) { return run_info(ctx, *info_ref); }; });

  auto* versions = app.add_subcommand(
      "versions",
      "List a repository's tags on the hub: channels (v1, v2: what configs name) by number, "
      "exact versions (1.4.2) in semver order, then other tags; registries through "
      "/v2/NAME/tags/list (every page), layouts through index.json. Signature tags "
      "(sha256-...) are left out. --json: {repo, hub, channels, versions, other, tags}");
  auto versions_repo = std::make_shared<std::string>();
  auto versions_limit = std::make_shared<size_t>(0);
  versions->add_option("repo", *versions_repo, "org/name")->required();
  versions->add_option("--limit", *versions_limit,
                       "Show at most N tags per group in the text output (default: all)");
  versions->callback([&run, versions_repo, versions_limit] {
    run = [versions_repo, versions_limit](Context& ctx) {
      return run_versions(ctx, *versions_repo, *versions_limit);
    };
  });
}

}  // namespace kh::cli
