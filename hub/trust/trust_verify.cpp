#include "hub/trust/trust_verify.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <optional>
#include <variant>
#include <vector>

#include "hub/base/env.h"
#include "hub/base/error.h"

namespace kh::trust {

namespace {

constexpr int64_t kMaxGraceS = int64_t{100} * 365 * 24 * 3600;

// Checks in the order they run: a failure further down the list says more about what is
// wrong (a validly signed statement for another tag beats a signature by an unknown key).
enum class Check {
  kNotSigned = 0,
  kUntrustedKey,
  kBadSignature,
  kMalformed,
  kKeyScope,
  kRepo,
  kTag,
  kDigest,
  kExpired,
  kRollback,
};

struct Failure {
  Check check;
  std::string reason;  // what failed, for the error and the unsigned warning
  std::string advice;  // what to do
};

struct Candidate {
  Statement statement;
  std::string key_id;                // the first trusted signer, for messages
  std::vector<std::string> key_ids;  // every trusted signer: each one's history counts
  bool in_grace = false;
  std::string warning;
};

std::string short_id(const std::string& keyid) {
  return keyid.substr(0, 16) + "...";
}

int64_t saturating_add(int64_t a, int64_t b) {
  if (b > 0 && a > std::numeric_limits<int64_t>::max() - b) {
    return std::numeric_limits<int64_t>::max();
  }
  return a + b;
}

// A time for messages; never throws, even for a clock outside what statements express.
std::string time_text(int64_t t) {
  if (t < 0 || t > 253402300799) return fmt::format("@{}", t);
  return format_time_rfc3339(t);
}

// One envelope through every check; returns the candidate or the first failure.
std::variant<Candidate, Failure> check_envelope(const TrustRequest& req, const Envelope& env,
                                                size_t index, const TrustStore& store,
                                                const TrustState& state, const TrustPolicy& policy,
                                                int64_t now) {
  // 1. Signatures over the raw statement bytes, before anything they cover is parsed.
  std::vector<std::string> valid, untrusted, bad;
  for (const auto& [keyid, sig] : env.sigs) {
    auto entries = store.find(keyid);
    if (entries.empty()) {
      untrusted.push_back(keyid);
    } else if (entries.front()->key.verify(env.statement, sig)) {
      valid.push_back(keyid);
    } else {
      bad.push_back(keyid);
    }
  }
  if (valid.empty()) {
    if (!bad.empty()) {
      return Failure{Check::kBadSignature,
                     fmt::format("bad signature by key {}: the signed statement or the signature "
                                 "was altered",
                                 short_id(bad.front())),
                     "the hub or a mirror serves damaged or forged signatures; do not use this "
                     "package, and report it to its publisher"};
    }
    if (untrusted.empty()) {
      return Failure{Check::kNotSigned, "an envelope holds no signatures",
                     fmt::format("sign it with `kernel-hub sign --key KEY {}`", req.ref_text)};
    }
    const std::string& id = untrusted.front();
    return Failure{
        Check::kUntrustedKey,
        fmt::format("signature by key {} which is not trusted (kernel-hub trust ls)", short_id(id)),
        fmt::format("if you trust its publisher, trust the key with `kernel-hub trust "
                    "add KEY.pub {}` (its id is {})",
                    req.repo, id)};
  }

  // 2. Parse strictly, now that a trusted key vouches for the bytes.
  Statement st;
  try {
    st = Statement::parse(env.statement, fmt::format("in envelope {}", index));
  } catch (const Error& e) {
    return Failure{Check::kMalformed, fmt::format("malformed signed statement: {}", e.what()),
                   "the publisher's signing tool is broken; ask them to sign again"};
  }

  // 3. A valid signer must be trusted for the repository the statement names. Every such signer
  // is kept: the hub orders the signatures, so none may stand for the others (rollback, 6).
  std::vector<std::string> signers;
  for (const auto& id : valid) {
    for (const TrustedKey* k : store.find(id)) {
      if (k->allows(st.repo) && std::find(signers.begin(), signers.end(), id) == signers.end())
        signers.push_back(id);
    }
  }
  if (signers.empty()) {
    std::vector<std::string> seen;
    std::string patterns;
    for (const TrustedKey* k : store.find(valid.front())) {
      for (const auto& p : k->repos) {
        if (std::find(seen.begin(), seen.end(), p) != seen.end()) continue;
        seen.push_back(p);
        patterns += (patterns.empty() ? "" : ", ") + p;
      }
    }
    return Failure{Check::kKeyScope,
                   fmt::format("key {} is trusted only for {}, not for {}", short_id(valid.front()),
                               patterns, st.repo),
                   fmt::format("if its publisher may sign {}, add that pattern with `kernel-hub "
                               "trust add KEY.pub {}`",
                               st.repo, st.repo)};
  }

  // 4. The statement must be about what was asked for: no substitution of another validly
  // signed package, tag or hub.
  if (st.repo != req.repo) {
    return Failure{Check::kRepo,
                   fmt::format("the signature is for repository {}, not {}", st.repo, req.repo),
                   fmt::format("the same index is signed for {} only (a hub may serve another "
                               "package's signature, or the index was packed under another "
                               "name and the cache holds that one's); do not use it as {} "
                               "unless its publisher signs it for {} (`kernel-hub sign`)",
                               st.repo, req.repo, req.repo)};
  }
  if (!req.hub_id.empty() && st.hub_id != req.hub_id) {
    return Failure{Check::kRepo,
                   fmt::format("the signature is for hub {}, not {}", st.hub_id, req.hub_id),
                   "the package was signed for another hub; ask its publisher to sign it for "
                   "this one"};
  }
  if (!req.tag.empty() && st.tag != req.tag) {
    return Failure{Check::kTag, fmt::format("the signature is for tag {}, not {}", st.tag, req.tag),
                   fmt::format("sign this tag with `kernel-hub sign --key KEY {}`", req.ref_text)};
  }
  if (st.index != req.index) {
    return Failure{Check::kDigest,
                   fmt::format("signed index digest {} but the hub served {}", st.index.str(),
                               req.index.str()),
                   "the index changed after it was signed (tampering, or a re-push without "
                   "re-signing); do not use it, ask the publisher to sign the current index"};
  }

  // 5. Freeze: an expired statement may be a hub replaying old content.
  Candidate c{st, signers.front(), signers, false, ""};
  if (now >= saturating_add(st.expires, policy.skew_s)) {
    int64_t grace_end = saturating_add(st.expires, policy.offline_grace_s);
    if (req.offline && now < grace_end) {
      c.in_grace = true;
      c.warning = fmt::format(
          "{}: the signature expired at {}; accepted offline within the "
          "grace period of {} ({} left); go online to fetch a fresh one "
          "(KERNEL_HUB_OFFLINE_GRACE sets the period)",
          req.ref_text, format_time_rfc3339(st.expires), format_duration(policy.offline_grace_s),
          format_duration(grace_end - now));
    } else if (req.offline) {
      return Failure{Check::kExpired,
                     fmt::format("statement expired at {}, beyond the offline grace period of {} "
                                 "(now {})",
                                 format_time_rfc3339(st.expires),
                                 format_duration(policy.offline_grace_s), time_text(now)),
                     "go online to fetch a fresh signature, or raise KERNEL_HUB_OFFLINE_GRACE"};
    } else {
      return Failure{Check::kExpired,
                     fmt::format("statement expired at {} (now {})",
                                 format_time_rfc3339(st.expires), time_text(now)),
                     "the publisher must sign it again (`kernel-hub sign`); a hub serving only "
                     "expired signatures may be replaying old content (freeze attack)"};
    }
  }

  // 6. Rollback, per tag: a digest pin names its content itself. Against this hub id's record,
  // strictly; against the records of every key that signed it under other hub ids (the signer
  // names the hub id, so changing it must not reset the count), only for other content: one
  // publisher pushing one index to two hubs signs it with two serials, and the older is not a
  // rollback. Records that share no key with it are another signer's.
  if (!req.tag.empty()) {
    auto rollback = [&](const SerialRecord& seen) -> std::optional<Failure> {
      if (st.serial < seen.serial)
        return Failure{Check::kRollback,
                       fmt::format("rollback: serial {} is older than serial {} seen before "
                                   "(index {}, hub id {}, at {})",
                                   st.serial, seen.serial, seen.index.str(), seen.hub_id,
                                   time_text(seen.seen_at)),
                       "the hub or a mirror serves an old signed version; fetch from an "
                       "up-to-date hub"};
      if (st.serial == seen.serial && st.index != seen.index)
        return Failure{Check::kRollback,
                       fmt::format("rollback: serial {} was seen before for index {}, now it "
                                   "signs {}",
                                   st.serial, seen.index.str(), st.index.str()),
                       "one serial must never sign two indexes; the publisher must sign with a "
                       "higher serial"};
      return std::nullopt;
    };
    if (auto seen = state.read(st.hub_id, st.repo, st.tag))
      if (auto f = rollback(*seen)) return *f;
    if (auto seen = state.read_highest(st.repo, st.tag, signers); seen && seen->index != st.index)
      if (auto f = rollback(*seen)) return *f;
  }
  return c;
}

}  // namespace

std::string format_duration(int64_t s) {
  if (s < 0) s = 0;
  const int64_t d = s / 86400, h = (s % 86400) / 3600, m = (s % 3600) / 60, sec = s % 60;
  if (d > 0) return h > 0 ? fmt::format("{}d {}h", d, h) : fmt::format("{}d", d);
  if (h > 0) return m > 0 ? fmt::format("{}h {}m", h, m) : fmt::format("{}h", h);
  if (m > 0) return sec > 0 ? fmt::format("{}m {}s", m, sec) : fmt::format("{}m", m);
  return fmt::format("{}s", sec);
}

TrustPolicy TrustPolicy::from_env() {
  TrustPolicy p;
  if (env_flag("KERNEL_HUB_ALLOW_UNSIGNED")) p.allow_unsigned = true;
  if (const char* v = std::getenv("KERNEL_HUB_OFFLINE_GRACE"); v && *v) {
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(v, &end, 10);
    if (*end != '\0' || errno != 0 || x < 0 || x > kMaxGraceS || !std::isdigit(*v)) {
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("KERNEL_HUB_OFFLINE_GRACE='{}' is not a number of seconds (how long "
                              "past its expiry a signature is still accepted offline; 0 = never)",
                              std::string(v).substr(0, 80)));
    }
    p.offline_grace_s = x;
  }
  return p;
}

TrustDecision verify_trust(const TrustRequest& req, const SignatureSet& sigs,
                           const TrustStore& store, TrustState& state, const TrustPolicy& policy,
                           int64_t now) {
  std::optional<Candidate> best;
  std::vector<Candidate> valid_candidates;
  std::optional<Failure> worst;
  for (size_t i = 0; i < sigs.envelopes.size(); ++i) {
    auto r = check_envelope(req, sigs.envelopes[i], i, store, state, policy, now);
    if (auto* c = std::get_if<Candidate>(&r)) {
      valid_candidates.push_back(*c);
      bool better =
          !best || c->statement.serial > best->statement.serial ||
          (c->statement.serial == best->statement.serial && best->in_grace && !c->in_grace);
      if (better) best = std::move(*c);
    } else {
      auto& f = std::get<Failure>(r);
      if (!worst || f.check > worst->check) worst = std::move(f);
    }
  }

  if (best) {
    const Statement& st = best->statement;
    if (!req.tag.empty()) {
      // Every trusted key that signed a valid statement vouched for this index (step 4): each
      // has seen this serial, whichever envelope held its signature and in whatever order.
      std::vector<std::string> signers;
      for (const Candidate& c : valid_candidates)
        for (const auto& k : c.key_ids)
          if (std::find(signers.begin(), signers.end(), k) == signers.end()) signers.push_back(k);
      state.advance(SerialRecord{st.hub_id, st.repo, st.tag, st.serial, st.index, st.expires, now,
                                 best->key_id, signers});
    }
    TrustDecision d;
    d.signed_ok = true;
    d.key_id = best->key_id;
    d.hub_id = st.hub_id;
    d.tag = st.tag;
    d.serial = st.serial;
    d.expires = st.expires;
    d.in_grace = best->in_grace;
    d.warning = best->warning;
    return d;
  }

  if (!worst) {
    worst = Failure{Check::kNotSigned,
                    fmt::format("not signed (no signature for index {})", req.index.str()),
                    fmt::format("sign it with `kernel-hub sign --key KEY {}`, trust its key with "
                                "`kernel-hub trust add`",
                                req.ref_text)};
  }
  if (policy.allow_unsigned) {
    TrustDecision d;
    d.unsigned_allowed = true;
    d.warning = fmt::format(
        "loading UNSIGNED package {} ({}): KERNEL_HUB_ALLOW_UNSIGNED/"
        "--allow-unsigned is set",
        req.ref_text, worst->reason);
    return d;
  }
  std::string advice = worst->advice;
  // Only where the package simply lacks a usable signature is the development escape
  // worth pointing at; after a forged or replayed signature it would be bad advice.
  if (worst->check == Check::kNotSigned || worst->check == Check::kUntrustedKey) {
    advice += ", or set KERNEL_HUB_ALLOW_UNSIGNED=1 for development";
  }
  std::string of_many =
      sigs.envelopes.size() > 1
          ? fmt::format(" (the furthest of {} signed statements)", sigs.envelopes.size())
          : "";
  throw Error(ErrorKind::kRefused,
              fmt::format("{}: refused: {}{}; {}", req.ref_text, worst->reason, of_many, advice));
}

}  // namespace kh::trust
