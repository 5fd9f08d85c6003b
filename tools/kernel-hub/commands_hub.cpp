// pull, push, info: the commands that talk to a hub.
#include <fmt/format.h>

#include <iostream>

#include "hub/error.h"
#include "tools/kernel-hub/cli.h"

namespace kh::cli {

namespace {

nlohmann::json pull_json(const PullReport& r) {
  return {{"ref", r.ref.str()},          {"digest", r.digest.str()},
          {"media_type", r.media_type},  {"manifests", r.manifests},
          {"blobs", r.blobs},            {"blobs_downloaded", r.blobs_downloaded},
          {"bytes_downloaded", r.bytes_downloaded}, {"total_bytes", r.total_bytes},
          {"from_cache", r.from_cache}};
}

int run_pull(Context& ctx, const std::vector<std::string>& refs, bool all_variants) {
  (void)all_variants;  // every variant is fetched until device filtering exists
  std::vector<Ref> parsed;
  for (auto& text : refs) parsed.push_back(Ref::parse(text));  // all refs valid before any I/O
  nlohmann::json out = nlohmann::json::array();
  int failures = 0;
  for (auto& ref : parsed) {
    try {
      PullReport r = ctx.hub().pull(ref);
      out.push_back(pull_json(r));
      ctx.say(fmt::format("{} {} ({} manifest{}, {} blob{}, {}; downloaded {}{})", ref.str(),
                          r.digest.str(), r.manifests, r.manifests == 1 ? "" : "s", r.blobs,
                          r.blobs == 1 ? "" : "s", human_bytes(r.total_bytes),
                          human_bytes(r.bytes_downloaded), r.from_cache ? ", offline" : ""));
    } catch (const Error& e) {
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
    ctx.say(fmt::format("pushed {} {} to {} ({} blob{} uploaded, {} already there, {})",
                        ref.str(), r.digest.str(), ctx.hub().address().text, r.blobs_uploaded,
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

int run_info(Context& ctx, const std::string& ref_text) {
  Ref ref = Ref::parse(ref_text);
  RefInfo info = ctx.hub().info(ref);
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
      "pull", "Fetch refs (index, every variant manifest and blob) into the cache and verify them");
  auto refs = std::make_shared<std::vector<std::string>>();
  auto all_variants = std::make_shared<bool>(false);
  pull->add_option("refs", *refs, "org/name[@TAG|@sha256:HEX] (default tag v1)")->required();
  pull->add_flag("--all-variants", *all_variants,
                 "Fetch every variant (today every variant is always fetched)");
  pull->callback([&run, refs, all_variants] {
    run = [refs, all_variants](Context& ctx) { return run_pull(ctx, *refs, *all_variants); };
  });

  auto* push = app.add_subcommand(
      "push", "Upload the index tagged in an OCI layout DIR (or its only one) to REF on the hub");
  auto dir = std::make_shared<std::string>();
  auto push_ref = std::make_shared<std::string>();
  push->add_option("dir", *dir, "OCI image layout directory")->required()->check(CLI::ExistingDirectory);
  push->add_option("ref", *push_ref, "destination org/name[@TAG]")->required();
  push->callback([&run, dir, push_ref] {
    run = [dir, push_ref](Context& ctx) { return run_push(ctx, *dir, *push_ref); };
  });

  auto* info = app.add_subcommand("info", "Show a ref's index and variants");
  auto info_ref = std::make_shared<std::string>();
  info->add_option("ref", *info_ref, "org/name[@TAG|@sha256:HEX]")->required();
  info->callback([&run, info_ref] {
    run = [info_ref](Context& ctx) { return run_info(ctx, *info_ref); };
  });
}

}  // namespace kh::cli
