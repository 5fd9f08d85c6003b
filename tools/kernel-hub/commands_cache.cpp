// ls, verify, gc: the commands that look after the local cache.
#include <fmt/format.h>

#include <iostream>

#include "hub/base/error.h"
#include "hub/oci/closure.h"
#include "tools/kernel-hub/cli.h"

namespace kh::cli {

namespace {

int run_ls(Context& ctx) {
  auto refs = ctx.store().list_refs();
  std::sort(refs.begin(), refs.end(), [](const RefRecord& a, const RefRecord& b) {
    return std::tie(a.hub_id, a.repo, a.tag) < std::tie(b.hub_id, b.repo, b.tag);
  });
  nlohmann::json out = nlohmann::json::array();
  if (!ctx.options().json && !refs.empty()) {
    ctx.say(fmt::format("{:<40} {:<19} {:>10}  {:<20}  {}", "REF", "DIGEST", "SIZE", "RESOLVED",
                        "HUB"));
  }
  for (auto& r : refs) {
    Closure c = closure_of(ctx.store(), r.digest);
    std::string name = r.repo + "@" + r.tag;
    out.push_back({{"ref", name},
                   {"hub", r.hub_id},
                   {"digest", r.digest.str()},
                   {"size", c.bytes},
                   {"complete", c.missing.empty()},
                   {"resolved_at", iso_time(r.resolved_at)}});
    ctx.say(fmt::format("{:<40} {:<19} {:>10}  {:<20}  {}{}", name, r.digest.str().substr(0, 19),
                        human_bytes(c.bytes), iso_time(r.resolved_at), r.hub_id,
                        c.missing.empty() ? "" : " (incomplete)"));
  }
  if (ctx.options().json) ctx.print_json(out);
  if (refs.empty()) ctx.note("the cache at " + ctx.store().root().string() + " holds no refs");
  return 0;
}

int run_verify(Context& ctx) {
  auto damage = ctx.store().verify();
  if (ctx.options().json) {
    nlohmann::json out = nlohmann::json::array();
    for (auto& d : damage) out.push_back({{"path", d.path.string()}, {"problem", d.problem}});
    ctx.print_json({{"ok", damage.empty()}, {"damaged", out}});
  } else if (damage.empty()) {
    ctx.say("cache " + ctx.store().root().string() + ": every blob verified");
  } else {
    for (auto& d : damage) std::cerr << "damaged: " << d.path.string() << ": " << d.problem << "\n";
    std::cerr << damage.size() << " damaged entr" << (damage.size() == 1 ? "y" : "ies")
              << "; pull the refs that use them again (`kernel-hub pull REF` replaces a "
                 "damaged blob), or remove them\n";
  }
  return damage.empty() ? 0 : 1;
}

// A limit given on the command line; `given` tells an empty value (refused) from none.
struct GcLimit {
  std::string text;
  bool given = false;
};

int run_gc(Context& ctx, const GcLimit& max_size, const GcLimit& older_than, bool dry_run) {
  GcOptions o;
  if (max_size.given) o.max_size = parse_size(max_size.text, "gc --max-size");
  if (older_than.given) o.older_than_s = parse_duration(older_than.text, "gc --older-than");
  o.dry_run = dry_run;
  GcResult r = ctx.store().gc(o);
  if (ctx.options().json) {
    ctx.print_json({{"removed_bytes", r.removed_bytes},
                    {"removed_entries", r.removed_entries},
                    {"kept_bytes", r.kept_bytes},
                    {"dry_run", dry_run}});
  } else {
    ctx.say(fmt::format("{} {} entr{} ({}), kept {}", dry_run ? "would remove" : "removed",
                        r.removed_entries, r.removed_entries == 1 ? "y" : "ies",
                        human_bytes(r.removed_bytes), human_bytes(r.kept_bytes)));
  }
  return 0;
}

}  // namespace

void add_cache_commands(CLI::App& app, Runner& run) {
  app.add_subcommand("ls", "List the refs the cache holds: ref, digest, size, when resolved")
      ->callback([&run] { run = run_ls; });
  app.add_subcommand("verify", "Re-hash the whole cache; exit 1 and list any damage")
      ->callback([&run] { run = run_verify; });

  auto* gc =
      app.add_subcommand("gc", "Remove cached entries no kept ref needs, by age or down to a size");
  auto max_size = std::make_shared<GcLimit>();
  auto older_than = std::make_shared<GcLimit>();
  auto dry_run = std::make_shared<bool>(false);
  auto* max_opt = gc->add_option("--max-size", max_size->text,
                                 "Shrink the cache to this size (e.g. 10G, 512M)");
  auto* age_opt =
      gc->add_option("--older-than", older_than->text,
                     "Drop refs not resolved within this time (e.g. 30d, 12h), then what they "
                     "alone needed");
  gc->add_flag("--dry-run", *dry_run, "Only report what would be removed");
  gc->callback([&run, max_size, older_than, dry_run, max_opt, age_opt] {
    max_size->given = max_opt->count() > 0;
    older_than->given = age_opt->count() > 0;
    run = [=](Context& ctx) { return run_gc(ctx, *max_size, *older_than, *dry_run); };
  });
}

}  // namespace kh::cli
