// keygen, sign, trust add/ls/rm: publishers' keys, signing an index on a hub, and the keys this
// machine trusts (hub/trust/trust_store.h). Loads check signatures in kernelize (registry/kernelize.cpp).
#include <fmt/format.h>

#include <iostream>

#include "hub/base/clock.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/trust/signature.h"
#include "hub/trust/trust_store.h"
#include "tools/kernel-hub/cli.h"

namespace kh::cli {

namespace {

nlohmann::json key_json(const trust::TrustedKey& k) {
  return {{"keyid", k.key_id()},
          {"repos", k.repos},
          {"builtin", k.builtin},
          {"added_at", k.added_at},
          {"path", k.path.string()}};
}

int run_keygen(Context& ctx, const std::string& out) {
  trust::PrivateKey key = trust::PrivateKey::generate();
  key.save(out);  // 0600, refuses to replace an existing file
  trust::PublicKey pub = key.public_key();
  std::string pub_path = out + ".pub";
  fs::write_file_atomic(pub_path, pub.pem(), 0644);
  if (ctx.options().json) {
    ctx.print_json({{"private_key", out}, {"public_key", pub_path}, {"keyid", pub.key_id()}});
  } else {
    ctx.say(fmt::format("private key {} (mode 0600; keep it secret)", out));
    ctx.say(fmt::format("public key  {}  keyid {}", pub_path, pub.key_id()));
    ctx.say(pub.pem());
    ctx.note(fmt::format("users trust it with: kernel-hub trust add {} --for ORG/*", pub_path));
  }
  return 0;
}

struct SignArgs {
  std::string key, ref, hub_id, expires_in = "90d";
  uint64_t serial = 0;
};

int run_sign(Context& ctx, const SignArgs& a) {
  Ref ref = Ref::parse(a.ref);
  trust::PrivateKey key = trust::PrivateKey::load(a.key);
  SignOptions o;
  o.hub_id = a.hub_id;
  o.serial = a.serial;
  o.expires = unix_now() + parse_duration(a.expires_in, "--expires-in");
  SignReport r = ctx.hub().sign(ref, key, o);
  const trust::Statement& st = r.statement;
  if (ctx.options().json) {
    ctx.print_json({{"ref", ref.str()},
                    {"index", st.index.str()},
                    {"hub_id", st.hub_id},
                    {"serial", st.serial},
                    {"expires", trust::format_time_rfc3339(st.expires)},
                    {"keyid", r.key_id}});
  } else {
    ctx.say(fmt::format("signed {} index {} on {} (hub id {}, serial {}, expires {}, key {})",
                        ref.str(), st.index.str(), ctx.hub().address().text, st.hub_id, st.serial,
                        trust::format_time_rfc3339(st.expires), r.key_id));
  }
  return 0;
}

trust::TrustStore open_user_store() {
  return trust::TrustStore::open(trust::TrustStore::default_dir());
}

int run_trust_add(Context& ctx, const std::string& file, std::vector<std::string> patterns) {
  if (patterns.empty()) patterns = {"*"};
  trust::PublicKey key = trust::PublicKey::load(file);
  trust::TrustStore store = open_user_store();
  const trust::TrustedKey& k = store.add(key, patterns);
  if (ctx.options().json) {
    ctx.print_json(key_json(k));
  } else {
    ctx.say(fmt::format("trusted key {} for {} ({})", k.key_id(), k.repos_text(), k.path.string()));
  }
  return 0;
}

int run_trust_ls(Context& ctx) {
  trust::TrustStore store = default_trust_store();
  if (ctx.options().json) {
    nlohmann::json keys = nlohmann::json::array();
    for (auto& k : store.list()) keys.push_back(key_json(k));
    ctx.print_json({{"dir", store.dir().string()}, {"keys", keys}, {"problems", store.problems()}});
    return 0;
  }
  ctx.say(fmt::format("trust store {}", store.dir().string()));
  if (store.list().empty()) ctx.say("  (no trusted keys: every package from a hub is refused)");
  for (auto& k : store.list())
    ctx.say(fmt::format("  {}  {}{}", k.key_id(), k.repos_text(),
                        k.builtin ? "  (built in: the embedded default hub's key)" : ""));
  for (auto& p : store.problems()) ctx.warn(p);
  return 0;
}

int run_trust_rm(Context& ctx, const std::string& keyid) {
  // With the built-in key loaded, so that its id is refused as built in rather than reported
  // missing (`trust ls` lists it).
  trust::TrustStore store = default_trust_store();
  std::string removed = store.remove(keyid);
  if (ctx.options().json) {
    ctx.print_json({{"removed", removed}});
  } else {
    ctx.say("removed key " + removed);
  }
  return 0;
}

}  // namespace

void add_trust_commands(CLI::App& app, Runner& run) {
  auto out = std::make_shared<std::string>();
  auto* keygen = app.add_subcommand(
      "keygen", "Make an Ed25519 signing key: KEY (PEM, mode 0600) and KEY.pub; prints the key id");
  keygen->add_option("-o,--output", *out, "Private key file to create (never overwritten)")
      ->required();
  keygen->callback([&run, out] { run = [out](Context& ctx) { return run_keygen(ctx, *out); }; });

  auto s = std::make_shared<SignArgs>();
  auto* sign = app.add_subcommand(
      "sign",
      "Sign REF's index on the hub: a statement over hub id, repo, tag, index digest, a serial "
      "that only grows and an expiry, attached as an OCI referrer (registries) or a sidecar "
      "file (layouts)");
  sign->add_option("ref", s->ref, "org/name@TAG to sign")->required();
  sign->add_option("--key", s->key, "Private key file (from kernel-hub keygen)")->required();
  sign->add_option("--expires-in", s->expires_in, "Validity from now (e.g. 90d, 12h)")
      ->capture_default_str();
  sign->add_option("--serial", s->serial,
                   "Serial number (default: now in unix seconds, above any on the hub)");
  sign->add_option("--hub-id", s->hub_id,
                   "Hub id the statement names (default: derived from the hub address)");
  sign->callback([&run, s] { run = [s](Context& ctx) { return run_sign(ctx, *s); }; });

  auto* trust_cmd = app.add_subcommand(
      "trust", "Manage the keys whose signatures this machine accepts ($KERNEL_HUB_TRUST_DIR)");
  trust_cmd->require_subcommand(1);
  auto file = std::make_shared<std::string>();
  auto patterns = std::make_shared<std::vector<std::string>>();
  auto* add = trust_cmd->add_subcommand("add", "Trust a public key (PEM) for repo patterns");
  add->add_option("keyfile", *file, "Public key file (KEY.pub from kernel-hub keygen)")->required();
  add->add_option("--for", *patterns,
                  "Repo pattern the key may sign: org/name, org/* or * (repeatable; default *)");
  add->callback([&run, file, patterns] {
    run = [file, patterns](Context& ctx) { return run_trust_add(ctx, *file, *patterns); };
  });
  trust_cmd->add_subcommand("ls", "List trusted keys and the repos each may sign")
      ->callback([&run] { run = run_trust_ls; });
  auto keyid = std::make_shared<std::string>();
  auto* rm = trust_cmd->add_subcommand("rm", "Stop trusting a key");
  rm->add_option("keyid", *keyid, "Key id or a unique prefix of at least 8 hex digits")->required();
  rm->callback(
      [&run, keyid] { run = [keyid](Context& ctx) { return run_trust_rm(ctx, *keyid); }; });
}

}  // namespace kh::cli
