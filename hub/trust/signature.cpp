#include "hub/trust/signature.h"

#include <fmt/format.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/oci/oci.h"
#include "hub/oci/ref.h"

namespace kh::trust {

namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMaxKeyFileBytes = 64 * 1024;

// --- OpenSSL plumbing -------------------------------------------------------------------

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;

std::shared_ptr<evp_pkey_st> own(EVP_PKEY* p) {
  return std::shared_ptr<evp_pkey_st>(p, PkeyFree{});
}

// Pops OpenSSL's error queue into one line, so a failure never leaks into a later report.
std::string openssl_error() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no OpenSSL error detail" : out;
}

BioPtr mem_bio(std::string_view bytes) {
  BioPtr bio(BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
  if (!bio) throw Error(ErrorKind::kIo, "OpenSSL: BIO_new_mem_buf failed: " + openssl_error());
  return bio;
}

std::string bio_contents(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  return std::string(data, n > 0 ? static_cast<size_t>(n) : 0);
}

// Never prompts on the terminal: an encrypted key file simply fails to load.
int no_passphrase(char*, int, int, void*) {
  return 0;
}

bool is_ed25519(EVP_PKEY* p) {
  return EVP_PKEY_get_id(p) == EVP_PKEY_ED25519;
}

std::string read_key_file(const stdfs::path& path, std::string_view kind) {
  try {
    return fs::read_file(path, kMaxKeyFileBytes);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kNotFound) {
      throw Error(ErrorKind::kNotFound,
                  fmt::format("{} file {} does not exist; create an Ed25519 key pair with `openssl "
                              "genpkey -algorithm ed25519 -out key.pem` (and `openssl pkey -in "
                              "key.pem -pubout -out key.pub`)",
                              kind, path.string()));
    }
    if (e.kind() == ErrorKind::kRefused) {
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("{} file {} is larger than {} bytes: not a PEM key file", kind,
                              path.string(), kMaxKeyFileBytes));
    }
    throw;
  }
}

// --- small text helpers ----------------------------------------------------------------

bool is_lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Quotes untrusted text for a message: at most 80 characters, non-printable bytes escaped.
std::string quote(std::string_view s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 80; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > 80) out += "...";
  return out + "'";
}

// Howard Hinnant's civil-date algorithms: exact for the proleptic Gregorian calendar, free of
// time zones and locale (timegm would do, but is not standard).
int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

void civil_from_days(int64_t z, int64_t& y, unsigned& m, unsigned& d) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const unsigned doe = static_cast<unsigned>(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  d = doy - (153 * mp + 2) / 5 + 1;
  m = mp < 10 ? mp + 3 : mp - 9;
  y = static_cast<int64_t>(yoe) + era * 400 + (m <= 2);
}

constexpr int64_t kMinTime = 0;             // 1970-01-01T00:00:00Z
constexpr int64_t kMaxTime = 253402300799;  // 9999-12-31T23:59:59Z

std::optional<uint64_t> parse_serial(std::string_view s) {
  // Decimal, no sign, no leading zeros ("0" itself is fine), fits in 64 bits.
  if (s.empty() || s.size() > 20) return std::nullopt;
  if (s.size() > 1 && s[0] == '0') return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    uint64_t digit = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - digit) / 10) return std::nullopt;
    v = v * 10 + digit;
  }
  return v;
}

// --- envelope JSON ---------------------------------------------------------------------

[[noreturn]] void bad_envelope(const std::string& what, const std::string& why) {
  throw Error(ErrorKind::kInvalidInput,
              fmt::format("invalid signature envelope {}: {} (expected {{\"statement\": "
                          "\"<base64>\", \"sigs\": [{{\"keyid\": \"<64 hex>\", \"sig\": "
                          "\"<base64>\"}}]}}); sign again with `kernel-hub sign`",
                          what, why));
}

// The rules Envelope::parse enforces, also checked before serializing so that we never
// write an envelope we would refuse to read.
void check_envelope(const Envelope& e, const std::string& what) {
  if (e.statement.empty()) bad_envelope(what, "the statement is empty");
  if (e.statement.size() > kMaxStatementBytes) {
    bad_envelope(what, fmt::format("the statement is {} bytes, over the {}-byte limit",
                                   e.statement.size(), kMaxStatementBytes));
  }
  if (e.sigs.empty()) bad_envelope(what, "it holds no signatures");
  if (e.sigs.size() > kMaxSigsPerEnvelope) {
    bad_envelope(what, fmt::format("{} signatures, over the limit of {}", e.sigs.size(),
                                   kMaxSigsPerEnvelope));
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < e.sigs.size(); ++i) {
    const auto& [keyid, sig] = e.sigs[i];
    if (!is_key_id(keyid)) {
      bad_envelope(what, fmt::format("sigs[{}].keyid {} is not 64 lowercase hex characters", i,
                                     quote(keyid)));
    }
    if (sig.size() != kEd25519SignatureBytes) {
      bad_envelope(what, fmt::format("sigs[{}].sig is {} bytes, an Ed25519 signature is {}", i,
                                     sig.size(), kEd25519SignatureBytes));
    }
    if (!seen.insert(keyid).second) {
      bad_envelope(what, fmt::format("sigs[{}]: key {} signs twice", i, keyid));
    }
  }
}

json envelope_to_json(const Envelope& e, const std::string& what) {
  check_envelope(e, what);
  json sigs = json::array();
  for (const auto& [keyid, sig] : e.sigs) {
    sigs.push_back({{"keyid", keyid}, {"sig", base64_encode(sig)}});
  }
  return {{"statement", base64_encode(e.statement)}, {"sigs", std::move(sigs)}};
}

Envelope envelope_from_json(const json& j, const std::string& what) {
  if (!j.is_object()) bad_envelope(what, "not a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (key != "statement" && key != "sigs") {
      bad_envelope(what, fmt::format("unknown field {}", quote(key)));
    }
  }
  Envelope e;
  auto st = j.find("statement");
  if (st == j.end()) bad_envelope(what, "field \"statement\" is missing");
  if (!st->is_string()) bad_envelope(what, "field \"statement\" is not a string");
  auto raw = base64_decode(st->get_ref<const std::string&>());
  if (!raw) bad_envelope(what, "field \"statement\" is not valid padded base64");
  e.statement = std::move(*raw);
  auto sigs = j.find("sigs");
  if (sigs == j.end()) bad_envelope(what, "field \"sigs\" is missing");
  if (!sigs->is_array()) bad_envelope(what, "field \"sigs\" is not an array");
  if (sigs->size() > kMaxSigsPerEnvelope) {
    bad_envelope(what, fmt::format("{} signatures, over the limit of {}", sigs->size(),
                                   kMaxSigsPerEnvelope));
  }
  for (size_t i = 0; i < sigs->size(); ++i) {
    const json& s = (*sigs)[i];
    if (!s.is_object()) bad_envelope(what, fmt::format("sigs[{}] is not an object", i));
    for (const auto& [key, value] : s.items()) {
      if (key != "keyid" && key != "sig") {
        bad_envelope(what, fmt::format("sigs[{}]: unknown field {}", i, quote(key)));
      }
    }
    auto keyid = s.find("keyid");
    auto sig = s.find("sig");
    if (keyid == s.end() || !keyid->is_string()) {
      bad_envelope(what, fmt::format("sigs[{}].keyid is missing or not a string", i));
    }
    if (sig == s.end() || !sig->is_string()) {
      bad_envelope(what, fmt::format("sigs[{}].sig is missing or not a string", i));
    }
    auto raw_sig = base64_decode(sig->get_ref<const std::string&>());
    if (!raw_sig) bad_envelope(what, fmt::format("sigs[{}].sig is not valid padded base64", i));
    e.sigs.emplace_back(keyid->get<std::string>(), std::move(*raw_sig));
  }
  check_envelope(e, what);
  return e;
}

json parse_json(std::string_view bytes, const std::string& what, std::string_view kind) {
  try {
    return json::parse(bytes.begin(), bytes.end());
  } catch (const json::exception& ex) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("invalid {} {}: not JSON ({}); sign again with `kernel-hub sign`", kind,
                            what, ex.what()));
  }
}

}  // namespace

bool is_key_id(std::string_view s) {
  return s.size() == 64 && is_lower_hex(s);
}

// --- time --------------------------------------------------------------------------------

std::string format_time_rfc3339(int64_t t) {
  if (t < kMinTime || t > kMaxTime) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("time {} (unix seconds) is outside 1970..9999, which statements "
                            "cannot express",
                            t));
  }
  int64_t days = t / 86400;
  int64_t secs = t % 86400;
  int64_t y;
  unsigned m, d;
  civil_from_days(days, y, m, d);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", y, m, d, secs / 3600, (secs / 60) % 60,
                     secs % 60);
}

std::optional<int64_t> parse_time_rfc3339(std::string_view s) {
  // Only the one canonical form, so that a statement has exactly one byte representation.
  if (s.size() != 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' ||
      s[16] != ':' || s[19] != 'Z') {
    return std::nullopt;
  }
  auto num = [&](size_t pos, size_t len) -> std::optional<unsigned> {
    unsigned v = 0;
    for (size_t i = pos; i < pos + len; ++i) {
      if (s[i] < '0' || s[i] > '9') return std::nullopt;
      v = v * 10 + static_cast<unsigned>(s[i] - '0');
    }
    return v;
  };
  auto y = num(0, 4), mo = num(5, 2), d = num(8, 2), h = num(11, 2), mi = num(14, 2),
       se = num(17, 2);
  if (!y || !mo || !d || !h || !mi || !se) return std::nullopt;
  if (*y < 1970 || *mo < 1 || *mo > 12 || *h > 23 || *mi > 59 || *se > 59) return std::nullopt;
  static const unsigned kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  bool leap = (*y % 4 == 0 && *y % 100 != 0) || *y % 400 == 0;
  unsigned month_days = kDays[*mo - 1] + ((*mo == 2 && leap) ? 1 : 0);
  if (*d < 1 || *d > month_days) return std::nullopt;
  return days_from_civil(*y, *mo, *d) * 86400 + *h * 3600 + *mi * 60 + *se;
}

bool is_valid_hub_id(std::string_view id) {
  if (id.empty() || id.size() > 128 || id.front() == '.') return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

// --- statement ---------------------------------------------------------------------------

void Statement::validate() const {
  auto fail = [&](const std::string& why) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("cannot sign a statement for {}@{}: {}", repo, tag, why));
  };
  if (!is_valid_hub_id(hub_id)) {
    fail("hub id " + quote(hub_id) +
         " is not a stable name of [A-Za-z0-9._-] (1..128 characters, no leading '.')");
  }
  if (repo.find('/') == std::string::npos || !is_valid_repo_name(repo)) {
    fail("repository " + quote(repo) + " is not a valid org/name");
  }
  if (!is_valid_tag(tag)) fail("tag " + quote(tag) + " is not a valid tag (a tag is required)");
  if (!Digest::is_valid(index.str())) {
    fail("index digest " + quote(index.str()) + " is not sha256: and 64 lowercase hex");
  }
  if (expires < kMinTime || expires > kMaxTime) {
    fail(fmt::format("expiry {} is outside 1970..9999", expires));
  }
}

std::string Statement::serialize() const {
  validate();
  return fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n{}\n", kStatementMagic, hub_id, repo, tag,
                     index.str(), serial, format_time_rfc3339(expires));
}

Statement Statement::parse(std::string_view bytes, const std::string& what) {
  auto fail = [&](const std::string& why) -> Statement {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("invalid signed statement {}: {} (expected seven LF-terminated "
                            "lines: {}, hub id, repo, tag, sha256:<hex>, serial, "
                            "YYYY-MM-DDTHH:MM:SSZ); the publisher must sign it again",
                            what, why, kStatementMagic));
  };
  if (bytes.size() > kMaxStatementBytes) {
    return fail(fmt::format("{} bytes, over the {}-byte limit", bytes.size(), kMaxStatementBytes));
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c == '\r') return fail(fmt::format("CR at byte {}: line ends are LF only", i));
    if (c != '\n' && (c < 0x21 || c > 0x7e)) {
      return fail(
          fmt::format("byte 0x{:02x} at offset {}: only printable ASCII without spaces "
                      "is allowed",
                      c, i));
    }
  }
  if (bytes.empty() || bytes.back() != '\n') {
    return fail("the last line must end with LF");
  }
  std::vector<std::string_view> lines;
  for (size_t start = 0; start < bytes.size();) {
    size_t end = bytes.find('\n', start);
    lines.push_back(bytes.substr(start, end - start));
    start = end + 1;
  }
  static const char* kNames[] = {"magic",        "hub id", "repo",   "tag",
                                 "index digest", "serial", "expires"};
  for (size_t i = 0; i < lines.size() && i < 7; ++i) {
    if (lines[i].empty()) return fail(fmt::format("line {} ({}) is empty", i + 1, kNames[i]));
  }
  if (lines.size() != 7) {
    return fail(
        fmt::format("{} lines{}", lines.size(),
                    lines.size() > 7 && lines[7].empty() ? " (an empty line after the last)" : ""));
  }
  if (lines[0] != kStatementMagic) {
    return fail("first line " + quote(lines[0]) + " is not " + std::string(kStatementMagic));
  }
  Statement s;
  s.hub_id = std::string(lines[1]);
  if (!is_valid_hub_id(s.hub_id)) {
    return fail("hub id " + quote(s.hub_id) + " is not [A-Za-z0-9._-] (1..128, no leading '.')");
  }
  s.repo = std::string(lines[2]);
  if (s.repo.find('/') == std::string::npos || !is_valid_repo_name(s.repo)) {
    return fail("repo " + quote(s.repo) + " is not a valid org/name");
  }
  s.tag = std::string(lines[3]);
  if (!is_valid_tag(s.tag)) return fail("tag " + quote(s.tag) + " is not a valid tag");
  if (!Digest::is_valid(lines[4])) {
    return fail("index digest " + quote(lines[4]) + " is not sha256: and 64 lowercase hex");
  }
  s.index = Digest::parse(lines[4]);
  auto serial = parse_serial(lines[5]);
  if (!serial) {
    return fail("serial " + quote(lines[5]) +
                " is not a 64-bit decimal number without sign or leading zeros");
  }
  s.serial = *serial;
  auto expires = parse_time_rfc3339(lines[6]);
  if (!expires) {
    return fail("expires " + quote(lines[6]) + " is not a UTC time YYYY-MM-DDTHH:MM:SSZ");
  }
  s.expires = *expires;
  return s;
}

// --- keys --------------------------------------------------------------------------------

PublicKey PublicKey::from_raw(std::string_view raw) {
  if (raw.size() != kEd25519PublicKeyBytes) {
    throw Error(ErrorKind::kInvalidInput, fmt::format("an Ed25519 public key is {} bytes, not {}",
                                                      kEd25519PublicKeyBytes, raw.size()));
  }
  EVP_PKEY* p = EVP_PKEY_new_raw_public_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
  if (p == nullptr) {
    throw Error(ErrorKind::kInvalidInput,
                "OpenSSL refused a raw Ed25519 public key: " + openssl_error());
  }
  PublicKey k;
  k.pkey_ = own(p);
  k.raw_ = std::string(raw);
  k.key_id_ = sha256_of(raw).hex;
  return k;
}

PublicKey PublicKey::load(const stdfs::path& path) {
  return parse_pem(read_key_file(path, "public key"), path.string());
}

PublicKey PublicKey::parse_pem(std::string_view text, const std::string& what) {
  BioPtr bio = mem_bio(text);
  std::unique_ptr<EVP_PKEY, PkeyFree> p(
      PEM_read_bio_PUBKEY(bio.get(), nullptr, no_passphrase, nullptr));
  if (!p) {
    std::string detail = openssl_error();
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{} is not a PEM public key (\"-----BEGIN PUBLIC KEY-----\"; {}); "
                            "export one with `openssl pkey -in key.pem -pubout`",
                            what, detail));
  }
  if (!is_ed25519(p.get())) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{} is a {} public key; kernel-hub signatures use Ed25519 only "
                            "(`openssl genpkey -algorithm ed25519`)",
                            what, EVP_PKEY_get0_type_name(p.get())));
  }
  unsigned char raw[kEd25519PublicKeyBytes];
  size_t n = sizeof raw;
  if (EVP_PKEY_get_raw_public_key(p.get(), raw, &n) != 1 || n != sizeof raw) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}: cannot read the raw Ed25519 key: {}", what, openssl_error()));
  }
  // Rebuilt from the raw bytes so every PublicKey is the same normalized object.
  return from_raw(std::string_view(reinterpret_cast<const char*>(raw), n));
}

std::string PublicKey::pem() const {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PUBKEY(bio.get(), pkey_.get()) != 1) {
    throw Error(ErrorKind::kIo, "OpenSSL: cannot write a PEM public key: " + openssl_error());
  }
  return bio_contents(bio.get());
}

bool PublicKey::verify(std::string_view message, std::string_view signature) const {
  if (!pkey_ || signature.size() != kEd25519SignatureBytes) return false;
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (!ctx) throw Error(ErrorKind::kIo, "OpenSSL: EVP_MD_CTX_new failed");
  // PureEdDSA: one shot, md must be NULL (REFERENCE 4.1).
  if (EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, pkey_.get()) != 1) {
    throw Error(ErrorKind::kIo,
                "OpenSSL: EVP_DigestVerifyInit(ed25519) failed: " + openssl_error());
  }
  int rc = EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                            signature.size(),
                            reinterpret_cast<const unsigned char*>(message.data()), message.size());
  // Anything but 1 (0 = mismatch, negative = malformed) is a failure; drop its queued errors.
  if (rc != 1) ERR_clear_error();
  return rc == 1;
}

PrivateKey PrivateKey::generate() {
  EVP_PKEY* p = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (p == nullptr) {
    throw Error(ErrorKind::kIo, "OpenSSL: Ed25519 key generation failed: " + openssl_error());
  }
  PrivateKey k;
  k.pkey_ = own(p);
  return k;
}

PrivateKey PrivateKey::load(const stdfs::path& path) {
  std::string text = read_key_file(path, "private key");
  try {
    PrivateKey k = parse_pem(text, path.string());
    OPENSSL_cleanse(text.data(), text.size());
    return k;
  } catch (...) {
    OPENSSL_cleanse(text.data(), text.size());
    throw;
  }
}

PrivateKey PrivateKey::parse_pem(std::string_view text, const std::string& what) {
  BioPtr bio = mem_bio(text);
  EVP_PKEY* p = PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr);
  if (p == nullptr) {
    std::string detail = openssl_error();
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{} is not an unencrypted PEM private key ({}); create one with "
                            "`openssl genpkey -algorithm ed25519 -out key.pem`",
                            what, detail));
  }
  PrivateKey k;
  k.pkey_ = own(p);
  if (!is_ed25519(p)) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{} is a {} private key; kernel-hub signatures use Ed25519 only "
                            "(`openssl genpkey -algorithm ed25519`)",
                            what, EVP_PKEY_get0_type_name(p)));
  }
  return k;
}

void PrivateKey::save(const stdfs::path& path) const {
  auto exists_error = [&] {
    return Error(ErrorKind::kRefused,
                 fmt::format("cannot save the private key to {}: the file already exists and a "
                             "key is never overwritten; choose another path or remove it first",
                             path.string()));
  };
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) throw exists_error();  // a dangling symlink counts too
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PKCS8PrivateKey(bio.get(), pkey_.get(), nullptr, nullptr, 0, nullptr,
                                            nullptr) != 1) {
    throw Error(ErrorKind::kIo, "OpenSSL: cannot write a PEM private key: " + openssl_error());
  }
  std::string pem = bio_contents(bio.get());
  stdfs::path dir = path.parent_path().empty() ? stdfs::path(".") : path.parent_path();
  bool created = false;
  {
    // The temp file is created 0600 (O_EXCL), so the key is never readable by others, and
    // link() in commit() refuses to replace an existing file even if one appeared meanwhile.
    fs::TempFile tmp(dir, "." + path.filename().string());
    tmp.write(pem);
    OPENSSL_cleanse(pem.data(), pem.size());
    created = tmp.commit(path, 0600, /*keep_existing=*/true);
  }
  // The memory BIO held the key too.
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  if (n > 0) OPENSSL_cleanse(data, static_cast<size_t>(n));
  if (!created) throw exists_error();
}

PublicKey PrivateKey::public_key() const {
  unsigned char raw[kEd25519PublicKeyBytes];
  size_t n = sizeof raw;
  if (EVP_PKEY_get_raw_public_key(pkey_.get(), raw, &n) != 1 || n != sizeof raw) {
    throw Error(ErrorKind::kIo, "OpenSSL: cannot read the Ed25519 public key: " + openssl_error());
  }
  return PublicKey::from_raw(std::string_view(reinterpret_cast<const char*>(raw), n));
}

std::string PrivateKey::sign(std::string_view message) const {
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (!ctx) throw Error(ErrorKind::kIo, "OpenSSL: EVP_MD_CTX_new failed");
  if (EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, pkey_.get()) != 1) {
    throw Error(ErrorKind::kIo, "OpenSSL: EVP_DigestSignInit(ed25519) failed: " + openssl_error());
  }
  std::string sig(kEd25519SignatureBytes, '\0');
  size_t n = sig.size();
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &n,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1 ||
      n != kEd25519SignatureBytes) {
    throw Error(ErrorKind::kIo, "OpenSSL: Ed25519 signing failed: " + openssl_error());
  }
  return sig;
}

// --- envelopes ---------------------------------------------------------------------------

std::string Envelope::serialize() const {
  return envelope_to_json(*this, "(being written)").dump();
}

Envelope Envelope::parse(std::string_view bytes, const std::string& what) {
  if (bytes.size() > kMaxEnvelopeBytes) {
    bad_envelope(what,
                 fmt::format("{} bytes, over the {}-byte limit", bytes.size(), kMaxEnvelopeBytes));
  }
  return envelope_from_json(parse_json(bytes, what, "signature envelope"), what);
}

void Envelope::add_signature(const PrivateKey& key) {
  std::string keyid = key.public_key().key_id();
  std::string sig = key.sign(statement);
  for (auto& [id, s] : sigs) {
    if (id == keyid) {
      s = std::move(sig);
      return;
    }
  }
  sigs.emplace_back(std::move(keyid), std::move(sig));
}

Envelope sign_statement(const Statement& statement, const PrivateKey& key) {
  Envelope e;
  e.statement = statement.serialize();
  e.add_signature(key);
  return e;
}

// --- signature sets ----------------------------------------------------------------------

std::string SignatureSet::serialize() const {
  if (envelopes.size() > kMaxEnvelopesPerSet) {
    throw Error(ErrorKind::kRefused,
                fmt::format("a signature set holds at most {} envelopes, not {}",
                            kMaxEnvelopesPerSet, envelopes.size()));
  }
  json list = json::array();
  for (size_t i = 0; i < envelopes.size(); ++i) {
    list.push_back(envelope_to_json(envelopes[i], fmt::format("envelopes[{}]", i)));
  }
  std::string out = json{{"envelopes", std::move(list)}}.dump();
  if (out.size() > kMaxSignatureSetBytes) {
    throw Error(ErrorKind::kRefused,
                fmt::format("a signature set is at most {} bytes, this one would be {}",
                            kMaxSignatureSetBytes, out.size()));
  }
  return out;
}

SignatureSet SignatureSet::parse(std::string_view bytes, const std::string& what) {
  auto fail = [&](const std::string& why) -> SignatureSet {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("invalid signature set {}: {} (expected {{\"envelopes\": "
                            "[<envelope>...]}}); the publisher must sign it again "
                            "(`kernel-hub sign`)",
                            what, why));
  };
  if (bytes.size() > kMaxSignatureSetBytes) {
    return fail(
        fmt::format("{} bytes, over the {}-byte limit", bytes.size(), kMaxSignatureSetBytes));
  }
  json j = parse_json(bytes, what, "signature set");
  if (!j.is_object()) return fail("not a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (key != "envelopes") return fail("unknown field " + quote(key));
  }
  auto list = j.find("envelopes");
  if (list == j.end() || !list->is_array())
    return fail("field \"envelopes\" is missing or not an array");
  if (list->size() > kMaxEnvelopesPerSet) {
    return fail(
        fmt::format("{} envelopes, over the limit of {}", list->size(), kMaxEnvelopesPerSet));
  }
  SignatureSet set;
  for (size_t i = 0; i < list->size(); ++i) {
    std::string name = fmt::format("{} envelopes[{}]", what, i);
    if ((*list)[i].dump().size() > kMaxEnvelopeBytes) {
      bad_envelope(name, fmt::format("over the {}-byte limit", kMaxEnvelopeBytes));
    }
    set.envelopes.push_back(envelope_from_json((*list)[i], name));
  }
  return set;
}

void SignatureSet::add(Envelope envelope) {
  check_envelope(envelope, "to add");
  const Statement fresh = Statement::parse(envelope.statement, "of the envelope to add");
  auto shares_key = [](const Envelope& a, const Envelope& b) {
    for (const auto& [ka, sa] : a.sigs) {
      for (const auto& [kb, sb] : b.sigs) {
        if (ka == kb) return true;
      }
    }
    return false;
  };
  // Two passes so that a refusal leaves the set as it was.
  std::vector<bool> replaced(envelopes.size(), false);
  for (size_t i = 0; i < envelopes.size(); ++i) {
    std::optional<Statement> s;
    try {
      s = Statement::parse(envelopes[i].statement, "in the set");
    } catch (const Error&) {
      // Not ours to judge here: verification skips it with a reason.
    }
    if (!s || s->hub_id != fresh.hub_id || s->repo != fresh.repo || s->tag != fresh.tag ||
        !shares_key(envelopes[i], envelope)) {
      continue;
    }
    if (s->serial > fresh.serial) {
      throw Error(ErrorKind::kRefused,
                  fmt::format("the signatures for {}@{} already hold serial {} by the same key; "
                              "a statement with serial {} would be a rollback: sign with a serial "
                              "greater than {}",
                              fresh.repo, fresh.tag, s->serial, fresh.serial, s->serial));
    }
    replaced[i] = true;
  }
  std::vector<Envelope> kept;
  for (size_t i = 0; i < envelopes.size(); ++i) {
    if (!replaced[i]) kept.push_back(envelopes[i]);
  }
  if (kept.size() >= kMaxEnvelopesPerSet) {
    throw Error(ErrorKind::kRefused,
                fmt::format("the signature set for {} already holds {} envelopes, the limit; "
                            "remove stale ones before adding another",
                            fresh.index.str(), kept.size()));
  }
  kept.push_back(std::move(envelope));
  // Deterministic order whatever the history of additions.
  auto sort_key = [](const Envelope& e) {
    std::tuple<std::string, std::string, std::string, std::string, uint64_t> k;
    std::get<3>(k) = e.sigs.empty() ? std::string() : e.sigs.front().first;
    try {
      Statement s = Statement::parse(e.statement, "in the set");
      std::get<0>(k) = s.hub_id;
      std::get<1>(k) = s.repo;
      std::get<2>(k) = s.tag;
      std::get<4>(k) = s.serial;
    } catch (const Error&) {
    }
    return k;
  };
  std::stable_sort(kept.begin(), kept.end(),
                   [&](const Envelope& a, const Envelope& b) { return sort_key(a) < sort_key(b); });
  envelopes = std::move(kept);
}

uint64_t next_serial(const SignatureSet& existing, const Statement& st, int64_t now) {
  uint64_t serial = now > 0 ? static_cast<uint64_t>(now) : 1;
  for (const auto& e : existing.envelopes) {
    try {
      Statement old = Statement::parse(e.statement, "signature");
      if (old.hub_id == st.hub_id && old.repo == st.repo && old.tag == st.tag)
        serial = std::max(serial, old.serial + 1);
    } catch (const Error&) {
    }
  }
  return serial;
}

}  // namespace kh::trust
