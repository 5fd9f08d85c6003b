// The one trust decision for a package, online or offline (REFERENCE 4.3). Callers pass the
// index digest they computed from the bytes they hold, so a tampered index shows up here as a
// digest mismatch.
#pragma once

#include <cstdint>
#include <string>

#include "hub/base/digest.h"
#include "hub/trust/signature.h"
#include "hub/trust/trust_state.h"
#include "hub/trust/trust_store.h"

namespace kh::trust {

struct TrustPolicy {
  bool allow_unsigned = false;
  int64_t offline_grace_s = 7 * 24 * 3600;  // how long past expiry offline mode still accepts
  int64_t skew_s = 300;                     // clock skew allowed on expiry

  // KERNEL_HUB_ALLOW_UNSIGNED=1|true|yes|on (0|false|no|off|empty: off; anything else is
  // kInvalidInput, since a typo must not silently change a security setting) and
  // KERNEL_HUB_OFFLINE_GRACE=<seconds>.
  static TrustPolicy from_env();
};

struct TrustRequest {
  std::string ref_text;  // for messages, e.g. "kernel-hub/norm@v1"
  std::string repo;
  std::string tag;  // empty when the ref is a digest pin: any tag's statement will do
  Digest index;     // the digest of the index bytes the caller holds
  bool offline = false;
  std::string hub_id;  // when set, the statement's hub id must equal it
};

struct TrustDecision {
  bool signed_ok = false;
  bool unsigned_allowed = false;
  std::string key_id;  // the trusted signer of the chosen statement
  std::string hub_id;
  std::string tag;  // the signed tag (for a digest pin, whichever tag's statement won)
  uint64_t serial = 0;
  int64_t expires = 0;
  bool in_grace = false;  // offline, past expiry, within the grace period
  std::string warning;    // for stderr when non-empty (grace or unsigned)
};

// For each envelope: signatures are checked with the store's keys (by keyid) before the
// statement is parsed; then the statement is parsed strictly; the signing key must be trusted
// for the statement's repo; repo (and hub id, when requested) must equal the request; tag must
// equal the request's tag (any tag for a digest pin); the index digest must equal the
// request's; freeze: now < expires + skew, or offline within offline_grace_s past expiry;
// rollback (tagged requests only): serial >= the stored serial for (hub id, repo, tag), equal
// only with the same index digest. The valid envelope with the highest serial wins and, for a
// tagged request, its serial is persisted in state when new or greater.
// When no envelope is valid: with policy.allow_unsigned, returns unsigned_allowed and a
// warning; otherwise throws kRefused naming the ref and the check that failed for the envelope
// that got furthest.
TrustDecision verify_trust(const TrustRequest& request, const SignatureSet& sigs,
                           const TrustStore& store, TrustState& state, const TrustPolicy& policy,
                           int64_t now);

// "3d 4h", "2h 5m", "40s": durations in messages.
std::string format_duration(int64_t seconds);

}  // namespace kh::trust
