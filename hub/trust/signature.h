// Signed kernels (REFERENCE 4.2): the statement a publisher signs, Ed25519 keys on OpenSSL 3,
// the JSON envelope that carries a statement and its signatures, and the set of envelopes kept
// for one index digest (a layout's signatures/sha256-<hex>.json sidecar, the cache's copy).
//
// Nothing here decides whether to trust anything: that is trust_verify.h. Parsers here are
// strict and size-capped because their input comes from hubs and mirrors.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hub/base/digest.h"

struct evp_pkey_st;  // OpenSSL's EVP_PKEY, kept out of this header

namespace kh::trust {

inline constexpr std::string_view kStatementMagic = "kernel-hub-sig-v1";
inline constexpr size_t kMaxStatementBytes = 4096;
inline constexpr size_t kMaxEnvelopeBytes = 64 * 1024;
inline constexpr size_t kMaxSigsPerEnvelope = 16;
inline constexpr size_t kMaxSignatureSetBytes = 1024 * 1024;
inline constexpr size_t kMaxEnvelopesPerSet = 64;
inline constexpr size_t kEd25519PublicKeyBytes = 32;
inline constexpr size_t kEd25519SignatureBytes = 64;

// "YYYY-MM-DDTHH:MM:SSZ" (RFC 3339, UTC, no fraction, years 1970..9999). format throws
// kInvalidInput outside that range; parse returns nullopt for anything but that exact form
// with valid calendar values (no leap second).
std::string format_time_rfc3339(int64_t unix_s);
std::optional<int64_t> parse_time_rfc3339(std::string_view text);

// A hub id in a statement is a stable name, not a URL (so mirrors verify): [A-Za-z0-9._-],
// 1..128 characters, not starting with '.' (it also names a directory of the trust state).
bool is_valid_hub_id(std::string_view id);

// A key id: 64 lower-case hex digits (the SHA-256 of the raw public key; it also names a
// directory of the trust state).
bool is_key_id(std::string_view s);

// What a publisher signs. serialize() gives the canonical bytes:
//   kernel-hub-sig-v1\n<hub-id>\n<repo>\n<tag>\n<sha256:hex>\n<serial>\n<expires>\n
// Exactly seven lines, each ended by one LF (so the bytes end with "\n" and never "\n\n"),
// ASCII only, no CR. The tag is required: a digest pin verifies against any tag's statement.
struct Statement {
  std::string hub_id;
  std::string repo;
  std::string tag;
  Digest index;
  uint64_t serial = 0;  // grows per (hub, repo, tag): rollback protection
  int64_t expires = 0;  // unix seconds: bounds a freeze attack

  // Throws kInvalidInput naming the field when a field breaks its rule.
  void validate() const;
  std::string serialize() const;
  // Strict: exactly the bytes serialize() would give for some valid statement. `what` names
  // the input in messages (a file, "statement of envelope 2 in ...").
  static Statement parse(std::string_view bytes, const std::string& what);
  bool operator==(const Statement&) const = default;
};

class PublicKey {
 public:
  // Ed25519 raw public key (32 bytes); throws kInvalidInput otherwise.
  static PublicKey from_raw(std::string_view raw);
  // PEM SubjectPublicKeyInfo ("-----BEGIN PUBLIC KEY-----"), Ed25519 only.
  static PublicKey load(const std::filesystem::path& path);
  static PublicKey parse_pem(std::string_view text, const std::string& what);

  std::string pem() const;
  const std::string& raw() const { return raw_; }
  // Lowercase hex sha256 of the 32 raw bytes: the envelope's "keyid".
  const std::string& key_id() const { return key_id_; }
  // True only when OpenSSL's EVP_DigestVerify returns 1 for this exact message.
  bool verify(std::string_view message, std::string_view signature) const;

  bool operator==(const PublicKey& o) const { return raw_ == o.raw_; }

 private:
  PublicKey() = default;
  std::shared_ptr<evp_pkey_st> pkey_;  // immutable once built, so copies share it
  std::string raw_;
  std::string key_id_;
};

class PrivateKey {
 public:
  static PrivateKey generate();
  // PEM PKCS#8, Ed25519 only. Encrypted keys are refused (no passphrase prompt).
  static PrivateKey load(const std::filesystem::path& path);
  static PrivateKey parse_pem(std::string_view text, const std::string& what);

  // Writes PEM PKCS#8 with mode 0600 atomically (temp -> fsync -> link); throws kRefused when
  // path already exists, never replacing a key.
  void save(const std::filesystem::path& path) const;
  PublicKey public_key() const;
  std::string sign(std::string_view message) const;  // 64 bytes

 private:
  PrivateKey() = default;
  std::shared_ptr<evp_pkey_st> pkey_;
};

// {"statement":"<base64>","sigs":[{"keyid":"<hex>","sig":"<base64>"}]}, at most 64 KiB.
// The statement stays raw bytes here: verifiers check signatures before parsing it.
struct Envelope {
  std::string statement;                                  // raw statement bytes
  std::vector<std::pair<std::string, std::string>> sigs;  // keyid, raw 64-byte signature

  // Compact JSON, keys sorted. Throws kInvalidInput when the envelope breaks a rule parse checks.
  std::string serialize() const;
  // Strict: exactly those two fields, 1..16 sigs with distinct keyids, 64-hex keyids, 64-byte
  // signatures, a 1..4096-byte statement. Throws kInvalidInput naming `what` and the rule.
  static Envelope parse(std::string_view bytes, const std::string& what);
  // Adds (or replaces) the signature of `key` over the statement bytes (k-of-n co-signing).
  void add_signature(const PrivateKey& key);
  bool operator==(const Envelope&) const = default;
};

// Serializes the statement (validating it) and signs it with one key.
Envelope sign_statement(const Statement& statement, const PrivateKey& key);

// Every envelope kept for one index digest: {"envelopes":[<envelope>...]}, at most 1 MiB and
// 64 envelopes. Envelopes may be for different tags (v1 and 1.0.0 naming one index) and
// different keys.
struct SignatureSet {
  std::vector<Envelope> envelopes;

  std::string serialize() const;
  static SignatureSet parse(std::string_view bytes, const std::string& what);
  // Adds an envelope whose statement parses. An envelope for the same (hub id, repo, tag) that
  // shares a keyid with it and has a lower or equal serial is replaced; one with a higher
  // serial makes add throw kRefused (re-sign with a higher serial). Envelopes are then kept
  // sorted by (hub id, repo, tag, first keyid, serial) so the file is deterministic. Throws
  // kRefused when the set would exceed its caps.
  void add(Envelope envelope);
  bool operator==(const SignatureSet&) const = default;
};

// The serial a new statement for `st`'s (hub id, repo, tag) gets by default: now in unix
// seconds, or one above the highest serial `existing` holds for them (statements that do not
// parse are ignored), so that two signings within a second still grow.
uint64_t next_serial(const SignatureSet& existing, const Statement& st, int64_t now);

}  // namespace kh::trust
