// Signed kernels: statements, Ed25519 keys (real OpenSSL, interop with the openssl CLI),
// envelopes and signature sets, the trust store, the rollback state and every refusal of
// verify_trust, each asserting that the message names the ref and the check that failed.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hub/base/base64.h"
#include "hub/base/digest.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/oci/oci.h"
#include "hub/trust/signature.h"
#include "hub/trust/trust_state.h"
#include "hub/trust/trust_store.h"
#include "hub/trust/trust_verify.h"
#include "tests/fixtures/process.h"

namespace kh::trust {
namespace {

namespace stdfs = std::filesystem;
using test::TempDir;

constexpr int64_t kNow = 1767225600;  // 2026-01-01T00:00:00Z
constexpr int64_t kDay = 24 * 3600;
const char* kRef = "kernel-hub/norm@v1";

Digest index_digest(const std::string& seed = "index") {
  return sha256_of(seed);
}

Statement statement(uint64_t serial = 5, const std::string& tag = "v1",
                    const Digest& index = index_digest(), int64_t expires = kNow + kDay,
                    const std::string& repo = "kernel-hub/norm") {
  Statement s;
  s.hub_id = "kernel-hub.dev";
  s.repo = repo;
  s.tag = tag;
  s.index = index;
  s.serial = serial;
  s.expires = expires;
  return s;
}

// Runs f, expects an Error of `kind` whose message contains every needle.
void expect_error(const std::function<void()>& f, ErrorKind kind,
                  const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needles.front() << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& n : needles) {
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message lacks '" << n << "': " << e.what();
    }
  }
}

// Sets (or unsets, for nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// --- time and base64 -------------------------------------------------------------------

TEST(TrustTime, FormatsAndParsesTheOneCanonicalForm) {
  EXPECT_EQ(format_time_rfc3339(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(format_time_rfc3339(kNow), "2026-01-01T00:00:00Z");
  EXPECT_EQ(format_time_rfc3339(951782400), "2000-02-29T00:00:00Z");
  EXPECT_EQ(format_time_rfc3339(253402300799), "9999-12-31T23:59:59Z");
  for (int64_t t : {int64_t{0}, int64_t{951782400}, kNow + 12345, int64_t{4102444799}}) {
    EXPECT_EQ(parse_time_rfc3339(format_time_rfc3339(t)), t);
  }
  for (const char* bad :
       {"2026-01-01T00:00:00", "2026-01-01 00:00:00Z", "2026-01-01T00:00:00z",
        "2026-01-01T00:00:00.5Z", "2026-01-01T00:00:00+00:00", "2026-1-01T00:00:00Z",
        "2001-02-29T00:00:00Z", "2026-13-01T00:00:00Z", "2026-00-10T00:00:00Z",
        "2026-04-31T00:00:00Z", "2026-01-01T24:00:00Z", "2026-01-01T23:60:00Z",
        "2026-12-31T23:59:60Z", "1969-12-31T23:59:59Z", "+026-01-01T00:00:00Z", ""}) {
    EXPECT_FALSE(parse_time_rfc3339(bad).has_value()) << bad;
  }
  EXPECT_TRUE(parse_time_rfc3339("2024-02-29T12:34:56Z").has_value());
  expect_error([] { format_time_rfc3339(-1); }, ErrorKind::kInvalidInput, {"1970..9999"});
}

TEST(TrustBase64, RoundTripsAndDecodesStrictly) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n < 70; ++n) {
    std::string bytes = all.substr(n, n);
    EXPECT_EQ(base64_decode(base64_encode(bytes)), bytes) << n;
  }
  EXPECT_EQ(base64_encode("A"), "QQ==");
  EXPECT_EQ(base64_decode(""), std::string());
  for (const char* bad : {"QQ=", "QQ", "Q===", "====", "QR==", "QUI=QQ==", " QQ==", "QQ==\n",
                          "QQ\n==", "Q Q=", "QQ=A", "@@@@", "QUJD-_==", "QUJ=="}) {
    EXPECT_FALSE(base64_decode(bad).has_value()) << bad;
  }
}

// --- statements --------------------------------------------------------------------------

const std::string kCanonical =
    "kernel-hub-sig-v1\n"
    "kernel-hub.dev\n"
    "kernel-hub/norm\n"
    "v1\n"
    "sha256:" +
    index_digest().hex +
    "\n"
    "5\n"
    "2026-01-02T00:00:00Z\n";

TEST(TrustStatement, SerializesCanonicallyAndParsesBack) {
  Statement s = statement();
  EXPECT_EQ(s.serialize(), kCanonical);
  EXPECT_EQ(Statement::parse(kCanonical, "test"), s);
  Statement big = statement(UINT64_MAX);
  EXPECT_EQ(Statement::parse(big.serialize(), "test").serial, UINT64_MAX);
  Statement zero = statement(0);
  EXPECT_EQ(Statement::parse(zero.serialize(), "test").serial, 0u);
}

TEST(TrustStatement, SerializeRefusesInvalidFields) {
  auto with = [](auto edit) {
    Statement s = statement();
    edit(s);
    return s;
  };
  expect_error([&] { with([](Statement& s) { s.tag = ""; }).serialize(); },
               ErrorKind::kInvalidInput, {"tag", "required"});
  expect_error([&] { with([](Statement& s) { s.hub_id = "a/b"; }).serialize(); },
               ErrorKind::kInvalidInput, {"hub id"});
  expect_error([&] { with([](Statement& s) { s.repo = "norm"; }).serialize(); },
               ErrorKind::kInvalidInput, {"repository"});
  expect_error([&] { with([](Statement& s) { s.index = Digest{"xyz"}; }).serialize(); },
               ErrorKind::kInvalidInput, {"index digest"});
}

// Replaces line `n` (0-based) of the canonical statement.
std::string with_line(size_t n, const std::string& value) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < kCanonical.size()) {
    size_t end = kCanonical.find('\n', start);
    lines.push_back(kCanonical.substr(start, end - start));
    start = end + 1;
  }
  lines[n] = value;
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

TEST(TrustStatement, ParseRejectsEachMalformation) {
  const std::string digest_line = "sha256:" + index_digest().hex;
  std::string crlf;
  for (char c : kCanonical) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "must end with LF"},
      {kCanonical.substr(0, kCanonical.size() - 1), "must end with LF"},  // no final newline
      {kCanonical + "\n", "an empty line after the last"},                // blank 8th line
      {kCanonical + "extra\n", "8 lines"},
      {kCanonical.substr(0, kCanonical.find("\n5\n") + 1), "5 lines"},
      {crlf, "CR at byte"},
      {with_line(0, "kernel-hub-sig-v2"), "first line"},
      {with_line(1, ""), "line 2 (hub id) is empty"},
      {with_line(1, ".hidden"), "hub id"},
      {with_line(1, "hub/with/slash"), "hub id"},
      {with_line(2, ""), "line 3 (repo) is empty"},
      {with_line(2, "norm"), "repo 'norm'"},
      {with_line(2, "Kernel-hub/norm"), "repo"},
      {with_line(2, "kernel-hub/norm/"), "repo"},
      {with_line(3, ""), "line 4 (tag) is empty"},
      {with_line(3, "-v1"), "tag '-v1'"},
      {with_line(3, "v1 "), "byte 0x20"},
      {with_line(4, "sha256:" + std::string(64, 'A')), "index digest"},
      {with_line(4, "sha512:" + index_digest().hex), "index digest"},
      {with_line(4, digest_line.substr(0, 70)), "index digest"},
      {with_line(5, "05"), "serial '05'"},
      {with_line(5, "+5"), "serial '+5'"},
      {with_line(5, "-5"), "serial '-5'"},
      {with_line(5, "18446744073709551616"), "serial"},
      {with_line(5, "5x"), "serial"},
      {with_line(6, "2026-01-02T00:00:00+00:00"), "expires"},
      {with_line(6, "2026-01-02"), "expires"},
      {with_line(6, "1767312000"), "expires"},
      {with_line(1, std::string("hub\0id", 6)), "byte 0x00"},
      {with_line(1, "h\xc3\xa9"), "byte 0xc3"},
      {kCanonical + std::string(5000, 'x'), "over the 4096-byte limit"},
  };
  for (const auto& [bytes, needle] : cases) {
    expect_error([&] { Statement::parse(bytes, "case.txt"); }, ErrorKind::kInvalidInput,
                 {"invalid signed statement case.txt", needle});
  }
}

// --- keys ----------------------------------------------------------------------------------

TEST(TrustKeys, GenerateSaveLoadRoundTripWithMode0600) {
  TempDir dir;
  PrivateKey key = PrivateKey::generate();
  stdfs::path path = dir / "keys" / "signing.pem";
  key.save(path);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string pem = fs::read_file(path);
  EXPECT_NE(pem.find("-----BEGIN PRIVATE KEY-----"), std::string::npos);

  PrivateKey loaded = PrivateKey::load(path);
  EXPECT_EQ(loaded.public_key(), key.public_key());
  std::string sig = loaded.sign("message");
  EXPECT_EQ(sig.size(), 64u);
  EXPECT_TRUE(key.public_key().verify("message", sig));

  // Never overwrites a key, and leaves the existing one untouched.
  PrivateKey other = PrivateKey::generate();
  expect_error([&] { other.save(path); }, ErrorKind::kRefused, {path.string(), "already exists"});
  EXPECT_EQ(fs::read_file(path), pem);
  // No temp files left behind.
  size_t entries = 0;
  for (const auto& e : stdfs::directory_iterator(dir / "keys")) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1u);
}

TEST(TrustKeys, PublicKeyFormsAndKeyId) {
  TempDir dir;
  PrivateKey key = PrivateKey::generate();
  PublicKey pub = key.public_key();
  EXPECT_EQ(pub.raw().size(), 32u);
  EXPECT_EQ(pub.key_id(), sha256_of(pub.raw()).hex);
  EXPECT_EQ(PublicKey::from_raw(pub.raw()), pub);
  std::string pem = pub.pem();
  EXPECT_NE(pem.find("-----BEGIN PUBLIC KEY-----"), std::string::npos);
  EXPECT_EQ(PublicKey::parse_pem(pem, "test"), pub);
  fs::write_file_atomic(dir / "key.pub", pem);
  EXPECT_EQ(PublicKey::load(dir / "key.pub").key_id(), pub.key_id());

  expect_error([] { PublicKey::from_raw("short"); }, ErrorKind::kInvalidInput, {"32 bytes"});
  expect_error([] { PublicKey::parse_pem("not a key", "junk.pem"); }, ErrorKind::kInvalidInput,
               {"junk.pem", "not a PEM public key"});
  expect_error([&] { PublicKey::load(dir / "missing.pub"); }, ErrorKind::kNotFound,
               {"missing.pub", "does not exist"});
  expect_error([&] { PrivateKey::load(dir / "missing.pem"); }, ErrorKind::kNotFound,
               {"missing.pem", "openssl genpkey"});
  // A public key file is not a private key.
  expect_error([&] { PrivateKey::load(dir / "key.pub"); }, ErrorKind::kInvalidInput,
               {"key.pub", "not an unencrypted PEM private key"});
}

TEST(TrustKeys, VerifyAcceptsOnlyTheExactMessageAndSignature) {
  PrivateKey key = PrivateKey::generate();
  PublicKey pub = key.public_key();
  std::string sig = key.sign("statement");
  EXPECT_TRUE(pub.verify("statement", sig));
  EXPECT_FALSE(pub.verify("statemenT", sig));
  EXPECT_FALSE(pub.verify("statement\n", sig));
  for (size_t i : {size_t{0}, size_t{31}, size_t{63}}) {
    std::string bad = sig;
    bad[i] ^= 1;
    EXPECT_FALSE(pub.verify("statement", bad)) << i;
  }
  EXPECT_FALSE(pub.verify("statement", sig.substr(0, 63)));
  EXPECT_FALSE(pub.verify("statement", sig + "x"));
  EXPECT_FALSE(pub.verify("statement", std::string(64, '\0')));
  EXPECT_FALSE(PrivateKey::generate().public_key().verify("statement", sig));
  // Ed25519 is deterministic.
  EXPECT_EQ(key.sign("statement"), sig);
}

class TrustOpensslCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_program("openssl")) GTEST_SKIP() << "openssl CLI not installed";
  }
  test::ProcessResult openssl(const std::vector<std::string>& args) {
    std::vector<std::string> argv{"openssl"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = test::run_process(argv, {}, 60);
    EXPECT_EQ(r.exit_code, 0) << "openssl failed: " << r.err;
    return r;
  }
  TempDir dir_;
};

TEST_F(TrustOpensslCli, KeysAndSignaturesInteroperate) {
  std::string key_pem = (dir_ / "key.pem").string(), pub_pem = (dir_ / "key.pub").string();
  openssl({"genpkey", "-algorithm", "ed25519", "-out", key_pem});
  openssl({"pkey", "-in", key_pem, "-pubout", "-out", pub_pem});
  PrivateKey key = PrivateKey::load(key_pem);
  PublicKey pub = PublicKey::load(pub_pem);
  EXPECT_EQ(key.public_key(), pub);

  // The CLI signs the statement file, we verify.
  std::string stmt = statement().serialize();
  fs::write_file_atomic(dir_ / "stmt", stmt);
  openssl({"pkeyutl", "-sign", "-rawin", "-inkey", key_pem, "-in", (dir_ / "stmt").string(), "-out",
           (dir_ / "sig").string()});
  std::string cli_sig = fs::read_file(dir_ / "sig");
  ASSERT_EQ(cli_sig.size(), 64u);
  EXPECT_TRUE(pub.verify(stmt, cli_sig));
  EXPECT_EQ(key.sign(stmt), cli_sig);  // deterministic: the same bytes
  Envelope env{stmt, {{pub.key_id(), cli_sig}}};
  EXPECT_EQ(Envelope::parse(env.serialize(), "cli"), env);

  // We sign, the CLI verifies; our saved key and public key read in the CLI.
  PrivateKey ours = PrivateKey::generate();
  ours.save(dir_ / "ours.pem");
  fs::write_file_atomic(dir_ / "ours.pub", ours.public_key().pem());
  fs::write_file_atomic(dir_ / "ours.sig", ours.sign(stmt));
  auto r =
      openssl({"pkeyutl", "-verify", "-rawin", "-pubin", "-inkey", (dir_ / "ours.pub").string(),
               "-in", (dir_ / "stmt").string(), "-sigfile", (dir_ / "ours.sig").string()});
  EXPECT_NE(r.out.find("Signature Verified Successfully"), std::string::npos) << r.out;
  auto text = openssl({"pkey", "-in", (dir_ / "ours.pem").string(), "-pubout"});
  EXPECT_EQ(text.out, ours.public_key().pem());
}

TEST_F(TrustOpensslCli, OtherKeyTypesAndEncryptedKeysAreRefused) {
  std::string ec = (dir_ / "ec.pem").string();
  openssl({"genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", ec});
  openssl({"pkey", "-in", ec, "-pubout", "-out", (dir_ / "ec.pub").string()});
  expect_error([&] { PrivateKey::load(ec); }, ErrorKind::kInvalidInput, {"EC", "Ed25519 only"});
  expect_error([&] { PublicKey::load(dir_ / "ec.pub"); }, ErrorKind::kInvalidInput,
               {"EC", "Ed25519 only"});
  // An encrypted key fails without prompting for a passphrase.
  std::string enc = (dir_ / "enc.pem").string();
  openssl(
      {"genpkey", "-algorithm", "ed25519", "-aes-128-cbc", "-pass", "pass:secret", "-out", enc});
  expect_error([&] { PrivateKey::load(enc); }, ErrorKind::kInvalidInput,
               {"enc.pem", "not an unencrypted PEM private key"});
}

// --- envelopes and signature sets ------------------------------------------------------------

TEST(TrustEnvelope, SignsAndRoundTrips) {
  PrivateKey a = PrivateKey::generate(), b = PrivateKey::generate();
  Envelope env = sign_statement(statement(), a);
  ASSERT_EQ(env.sigs.size(), 1u);
  EXPECT_EQ(env.statement, kCanonical);
  EXPECT_EQ(env.sigs[0].first, a.public_key().key_id());
  EXPECT_TRUE(a.public_key().verify(env.statement, env.sigs[0].second));
  env.add_signature(b);
  env.add_signature(b);  // replaces, never duplicates
  EXPECT_EQ(env.sigs.size(), 2u);
  std::string json = env.serialize();
  EXPECT_EQ(json.find("{\"sigs\":[{\"keyid\":"), 0u) << json;
  EXPECT_EQ(Envelope::parse(json, "env.json"), env);
  EXPECT_EQ(Envelope::parse(json, "env.json").serialize(), json);
}

TEST(TrustEnvelope, ParseRejectsMalformedEnvelopes) {
  PrivateKey key = PrivateKey::generate();
  std::string keyid = key.public_key().key_id();
  std::string stmt64 = base64_encode(kCanonical);
  std::string sig64 = base64_encode(key.sign(kCanonical));
  auto env = [&](const std::string& statement, const std::string& sigs) {
    return "{\"statement\":" + statement + ",\"sigs\":" + sigs + "}";
  };
  auto sig = [&](const std::string& id, const std::string& s) {
    return "{\"keyid\":\"" + id + "\",\"sig\":\"" + s + "\"}";
  };
  std::string ok_sigs = "[" + sig(keyid, sig64) + "]";
  ASSERT_NO_THROW(Envelope::parse(env("\"" + stmt64 + "\"", ok_sigs), "ok"));
  std::string many = "[";
  for (int i = 0; i < 17; ++i) {
    many += (i ? "," : "") + sig(sha256_of(std::to_string(i)).hex, sig64);
  }
  many += "]";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "not JSON"},
      {"[]", "not a JSON object"},
      {"{\"sigs\":" + ok_sigs + "}", "\"statement\" is missing"},
      {"{\"statement\":\"" + stmt64 + "\"}", "\"sigs\" is missing"},
      {env("42", ok_sigs), "\"statement\" is not a string"},
      {env("\"" + stmt64 + "\"", "{}"), "\"sigs\" is not an array"},
      {env("\"" + stmt64 + "\"", "[]"), "no signatures"},
      {env("\"" + stmt64.substr(1) + "\"", ok_sigs), "not valid padded base64"},
      {env("\"" + stmt64 + "\\n\"", ok_sigs), "not valid padded base64"},
      {env("\"\"", ok_sigs), "the statement is empty"},
      {env("\"" + base64_encode(std::string(5000, 'x')) + "\"", ok_sigs), "4096-byte limit"},
      {env("\"" + stmt64 + "\"", "[" + sig(keyid, "!!!!") + "]"), "sigs[0].sig is not valid"},
      {env("\"" + stmt64 + "\"", "[" + sig(keyid, base64_encode("short")) + "]"),
       "sigs[0].sig is 5 bytes"},
      {env("\"" + stmt64 + "\"", "[" + sig(keyid.substr(2), sig64) + "]"), "sigs[0].keyid"},
      {env("\"" + stmt64 + "\"", "[{\"keyid\":\"" + keyid + "\"}]"), "sigs[0].sig is missing"},
      {env("\"" + stmt64 + "\"", "[{\"sig\":\"" + sig64 + "\"}]"), "sigs[0].keyid is missing"},
      {env("\"" + stmt64 + "\"", "[" + sig(keyid, sig64) + "," + sig(keyid, sig64) + "]"),
       "signs twice"},
      {env("\"" + stmt64 + "\"", "[\"x\"]"), "sigs[0] is not an object"},
      {env("\"" + stmt64 + "\"", many), "17 signatures"},
      {"{\"statement\":\"" + stmt64 + "\",\"sigs\":" + ok_sigs + ",\"extra\":1}",
       "unknown field 'extra'"},
      {env("\"" + stmt64 + "\"", ok_sigs) + std::string(70000, ' '), "65536-byte limit"},
  };
  for (const auto& [bytes, needle] : cases) {
    expect_error([&] { Envelope::parse(bytes, "bad.json"); }, ErrorKind::kInvalidInput,
                 {"bad.json", needle});
  }
}

TEST(TrustSignatureSet, AddReplacesOlderAndKeepsADeterministicOrder) {
  PrivateKey a = PrivateKey::generate(), b = PrivateKey::generate();
  SignatureSet set;
  set.add(sign_statement(statement(3, "v1"), a));
  set.add(sign_statement(statement(1, "1.0.0"), a));
  set.add(sign_statement(statement(3, "v1"), b));
  ASSERT_EQ(set.envelopes.size(), 3u);
  set.add(sign_statement(statement(4, "v1"), a));  // replaces a's serial 3 for v1
  set.add(sign_statement(statement(4, "v1"), a));  // equal serial: replaces again
  ASSERT_EQ(set.envelopes.size(), 3u);
  int v1_by_a = 0;
  for (const auto& e : set.envelopes) {
    Statement s = Statement::parse(e.statement, "t");
    if (s.tag == "v1" && e.sigs[0].first == a.public_key().key_id()) {
      ++v1_by_a;
      EXPECT_EQ(s.serial, 4u);
    }
  }
  EXPECT_EQ(v1_by_a, 1);
  // An older statement for the same slot is refused and leaves the set unchanged.
  SignatureSet before = set;
  expect_error([&] { set.add(sign_statement(statement(2, "v1"), a)); }, ErrorKind::kRefused,
               {"kernel-hub/norm@v1", "serial 4", "greater than 4"});
  EXPECT_EQ(set, before);

  // The same additions in another order give the same bytes.
  SignatureSet other;
  other.add(sign_statement(statement(3, "v1"), b));
  other.add(sign_statement(statement(4, "v1"), a));
  other.add(sign_statement(statement(1, "1.0.0"), a));
  EXPECT_EQ(other.serialize(), set.serialize());
  EXPECT_EQ(SignatureSet::parse(set.serialize(), "set.json"), set);
  EXPECT_EQ(SignatureSet::parse("{\"envelopes\":[]}", "empty").envelopes.size(), 0u);

  expect_error(
      [&] {
        set.add(Envelope{"garbage", {{a.public_key().key_id(), a.sign("garbage")}}});
      },
      ErrorKind::kInvalidInput, {"invalid signed statement"});
}

TEST(TrustSignatureSet, ParseAndAddEnforceTheCaps) {
  PrivateKey key = PrivateKey::generate();
  SignatureSet set;
  for (int i = 0; i < 64; ++i) set.add(sign_statement(statement(1, "t" + std::to_string(i)), key));
  expect_error([&] { set.add(sign_statement(statement(1, "one-more"), key)); }, ErrorKind::kRefused,
               {"64 envelopes"});
  std::string full = set.serialize();
  EXPECT_EQ(SignatureSet::parse(full, "full.json").envelopes.size(), 64u);
  std::string env = set.envelopes[0].serialize();
  std::string too_many = full.substr(0, full.size() - 2) + "," + env + "]}";
  expect_error([&] { SignatureSet::parse(too_many, "many.json"); }, ErrorKind::kInvalidInput,
               {"many.json", "65 envelopes"});
  expect_error([&] { SignatureSet::parse(full + std::string(1100000, ' '), "big.json"); },
               ErrorKind::kInvalidInput, {"big.json", "1048576-byte limit"});
  expect_error([&] { SignatureSet::parse("{\"envelopes\":[],\"x\":1}", "x.json"); },
               ErrorKind::kInvalidInput, {"x.json", "unknown field 'x'"});
  expect_error([&] { SignatureSet::parse("{\"envelopes\":[{}]}", "e.json"); },
               ErrorKind::kInvalidInput, {"e.json envelopes[0]", "\"statement\" is missing"});
  expect_error([&] { SignatureSet::parse("{", "t.json"); }, ErrorKind::kInvalidInput,
               {"t.json", "not JSON"});
}

// --- trust store -----------------------------------------------------------------------------

TEST(TrustStorePatterns, ValidityAndMatching) {
  for (const char* ok : {"*", "org/*", "org/name", "org/team/*", "org", "a.b-c/x_y"}) {
    EXPECT_TRUE(is_valid_repo_pattern(ok)) << ok;
  }
  for (const char* bad : {"", "org*", "*/name", "org/*/name", "org/", "/*", "**", "org/**", "Org/*",
                          "org/name*", "org/*x", " *"}) {
    EXPECT_FALSE(is_valid_repo_pattern(bad)) << bad;
  }
  struct Case {
    const char* pattern;
    const char* repo;
    bool match;
  };
  for (const Case& c : std::vector<Case>{{"*", "kernel-hub/norm", true},
                                         {"kernel-hub/*", "kernel-hub/norm", true},
                                         {"kernel-hub/*", "kernel-hub/team/norm", true},
                                         {"kernel-hub/*", "kernel-hub", false},
                                         {"kernel-hub/*", "kernel-hubx/norm", false},
                                         {"kernel-hub/norm", "kernel-hub/norm", true},
                                         {"kernel-hub/norm", "kernel-hub/norm2", false},
                                         {"kernel-hub/norm", "kernel-hub/norm/x", false},
                                         {"org/*", "kernel-hub/norm", false},
                                         {"org*", "orgx/y", false}}) {
    EXPECT_EQ(repo_pattern_matches(c.pattern, c.repo), c.match) << c.pattern << " " << c.repo;
  }
}

TEST(TrustStoreDir, AddListRemoveAndReopen) {
  TempDir dir;
  stdfs::path trust = dir / "trust";
  TrustStore store = TrustStore::open(trust);  // a missing directory is an empty store
  EXPECT_TRUE(store.list().empty());
  PublicKey a = PrivateKey::generate().public_key(), b = PrivateKey::generate().public_key();
  const TrustedKey& ka = store.add(a, {"org/*", "org/*", "kernel-hub/norm"}, 1000);
  EXPECT_EQ(ka.repos, (std::vector<std::string>{"org/*", "kernel-hub/norm"}));
  EXPECT_EQ(ka.path, trust / (a.key_id() + ".json"));
  store.add(b, {"*"}, 2000);
  ASSERT_EQ(store.list().size(), 2u);

  auto j = nlohmann::json::parse(fs::read_file(trust / (a.key_id() + ".json")));
  EXPECT_EQ(j.at("keyid"), a.key_id());
  EXPECT_EQ(j.at("public_key"), a.pem());
  EXPECT_EQ(j.at("repos"), (std::vector<std::string>{"org/*", "kernel-hub/norm"}));
  EXPECT_EQ(j.at("added_at"), 1000);

  TrustStore reopened = TrustStore::open(trust);
  ASSERT_EQ(reopened.list().size(), 2u);
  EXPECT_TRUE(reopened.problems().empty());
  EXPECT_EQ(reopened.find(a.key_id()).size(), 1u);
  EXPECT_EQ(reopened.find(a.key_id())[0]->key, a);
  EXPECT_EQ(reopened.keys_for("org/x").size(), 2u);  // a via org/*, b via *
  EXPECT_EQ(reopened.keys_for("other/x").size(), 1u);

  // Re-adding replaces the patterns and keeps added_at.
  reopened.add(a, {"solo/name"}, 5000);
  TrustStore third = TrustStore::open(trust);
  ASSERT_EQ(third.find(a.key_id()).size(), 1u);
  EXPECT_EQ(third.find(a.key_id())[0]->repos, std::vector<std::string>{"solo/name"});
  EXPECT_EQ(third.find(a.key_id())[0]->added_at, 1000);
  EXPECT_TRUE(third.keys_for("org/x").size() == 1u);

  // Remove by a unique 8-character prefix.
  EXPECT_EQ(third.remove(a.key_id().substr(0, 8)), a.key_id());
  EXPECT_FALSE(stdfs::exists(trust / (a.key_id() + ".json")));
  EXPECT_TRUE(third.find(a.key_id()).empty());
  EXPECT_EQ(TrustStore::open(trust).list().size(), 1u);
  expect_error([&] { third.remove(a.key_id()); }, ErrorKind::kNotFound,
               {a.key_id(), "kernel-hub trust ls"});
  expect_error([&] { third.remove("abc"); }, ErrorKind::kInvalidInput, {"'abc'", "8"});
  expect_error([&] { third.remove("ABCDEF0123"); }, ErrorKind::kInvalidInput, {"ABCDEF0123"});
  expect_error([&] { third.add(a, {}); }, ErrorKind::kInvalidInput, {"at least one"});
  expect_error([&] { third.add(a, {"org*"}); }, ErrorKind::kInvalidInput,
               {"invalid repository pattern 'org*'"});
}

TEST(TrustStoreDir, BuiltinKeysAreListedButNeverWritten) {
  TempDir dir;
  TrustStore store = TrustStore::open(dir / "trust");
  PublicKey builtin = PrivateKey::generate().public_key();
  PublicKey added = PrivateKey::generate().public_key();
  store.add(added, {"*"});
  store.add_builtin(builtin, {"kernel-hub/*"});
  ASSERT_EQ(store.list().size(), 2u);
  EXPECT_TRUE(store.list()[0].builtin);  // built-in keys first
  EXPECT_EQ(store.list()[0].key, builtin);
  EXPECT_FALSE(stdfs::exists(dir / "trust" / (builtin.key_id() + ".json")));
  expect_error([&] { store.remove(builtin.key_id()); }, ErrorKind::kRefused, {"built in"});
  EXPECT_EQ(store.keys_for("kernel-hub/norm").size(), 2u);
  EXPECT_EQ(store.keys_for("org/norm").size(), 1u);
  TrustStore memory_only;
  memory_only.add_builtin(builtin, {"kernel-hub/*"});
  EXPECT_EQ(memory_only.list().size(), 1u);
  expect_error([&] { memory_only.add(added, {"*"}); }, ErrorKind::kIo, {"no directory"});
}

TEST(TrustStoreDir, DamagedOrForgedFilesAreSkippedAndReported) {
  TempDir dir;
  stdfs::path trust = dir / "trust";
  PublicKey good = PrivateKey::generate().public_key();
  PublicKey other = PrivateKey::generate().public_key();
  TrustStore::open(trust).add(good, {"*"});
  fs::write_file_atomic(trust / (std::string(64, 'a') + ".json"), "{not json");
  // A file claiming another key's id must not lend it that id.
  nlohmann::json forged{
      {"keyid", good.key_id()}, {"public_key", other.pem()}, {"repos", {"*"}}, {"added_at", 1}};
  fs::write_file_atomic(trust / (std::string(64, 'b') + ".json"), forged.dump());
  nlohmann::json bad_pattern{
      {"keyid", other.key_id()}, {"public_key", other.pem()}, {"repos", {"org*"}}, {"added_at", 1}};
  fs::write_file_atomic(trust / (other.key_id() + ".json"), bad_pattern.dump());
  fs::write_file_atomic(trust / "notes.json", "{}");
  fs::write_file_atomic(trust / ".tmp.json", "{}");  // hidden: ignored silently
  fs::write_file_atomic(trust / "README", "text");   // not .json: ignored silently
  TrustStore store = TrustStore::open(trust);
  ASSERT_EQ(store.list().size(), 1u);
  EXPECT_EQ(store.list()[0].key, good);
  EXPECT_EQ(store.problems().size(), 4u);
  for (const auto& p : store.problems())
    EXPECT_NE(p.find("ignoring trust file"), std::string::npos);
}

TEST(TrustStoreDir, DefaultDirFollowsTheEnvironment) {
  {
    ScopedEnv a("KERNEL_HUB_TRUST_DIR", "/x/trust");
    ScopedEnv b("XDG_CONFIG_HOME", "/cfg");
    EXPECT_EQ(TrustStore::default_dir(), stdfs::path("/x/trust"));
  }
  {
    ScopedEnv a("KERNEL_HUB_TRUST_DIR", std::nullopt);
    ScopedEnv b("XDG_CONFIG_HOME", "/cfg");
    EXPECT_EQ(TrustStore::default_dir(), stdfs::path("/cfg/kernel-hub/trust"));
  }
  {
    ScopedEnv a("KERNEL_HUB_TRUST_DIR", std::nullopt);
    ScopedEnv b("XDG_CONFIG_HOME", "relative");  // ignored, as XDG says
    ScopedEnv c("HOME", "/home/u");
    EXPECT_EQ(TrustStore::default_dir(), stdfs::path("/home/u/.config/kernel-hub/trust"));
  }
}

// --- trust state -----------------------------------------------------------------------------

TEST(TrustStateFiles, PersistsAcrossObjectsAndOnlyAdvances) {
  TempDir dir;
  const std::string key(64, 'c');
  SerialRecord r{
      "kernel-hub.dev", "kernel-hub/norm", "v1", 5, index_digest(), kNow + kDay, kNow, key, {key}};
  {
    TrustState state(dir.path());
    EXPECT_FALSE(state.read(r.hub_id, r.repo, r.tag).has_value());
    state.write(r);
  }
  EXPECT_TRUE(stdfs::exists(dir / "kernel-hub.dev/kernel-hub/norm/v1.json"));
  TrustState state(dir.path());
  EXPECT_EQ(state.read(r.hub_id, r.repo, r.tag), r);
  SerialRecord older = r;
  older.serial = 4;
  EXPECT_FALSE(state.advance(older));
  EXPECT_FALSE(state.advance(r));
  SerialRecord newer = r;
  newer.serial = 6;
  newer.index = index_digest("other");
  EXPECT_TRUE(state.advance(newer));
  EXPECT_EQ(TrustState(dir.path()).read(r.hub_id, r.repo, r.tag), newer);
  // The key's own record moved with it, and is what read_highest finds under any hub id.
  ASSERT_TRUE(state.read_key(key, r.repo, r.tag).has_value());
  EXPECT_EQ(state.read_key(key, r.repo, r.tag)->serial, 6u);
  EXPECT_EQ(state.read_highest(r.repo, r.tag, {key})->serial, 6u);
  EXPECT_FALSE(state.read_highest(r.repo, r.tag, {std::string(64, 'd')}).has_value());
  EXPECT_FALSE(state.read(r.hub_id, r.repo, "v2").has_value());
  EXPECT_FALSE(state.read("other-hub", r.repo, r.tag).has_value());
}

TEST(TrustStateFiles, RejectsUnsafeNamesAndIgnoresDamagedRecords) {
  TempDir dir;
  TrustState state(dir.path());
  for (const char* hub : {"", ".", "..", "../x", "a/b", ".hidden", "a b", "a\\b"}) {
    expect_error([&] { state.read(hub, "kernel-hub/norm", "v1"); }, ErrorKind::kInvalidInput,
                 {"invalid hub id"});
  }
  for (const char* repo : {"norm", "../norm", "kernel-hub/../x", "/abs/x", "Kernel/x"}) {
    expect_error([&] { state.read("hub", repo, "v1"); }, ErrorKind::kInvalidInput,
                 {"invalid repository"});
  }
  for (const char* tag : {"", "..", ".x", "a/b"}) {
    expect_error([&] { state.read("hub", "kernel-hub/norm", tag); }, ErrorKind::kInvalidInput,
                 {"invalid tag"});
  }
  stdfs::path p = state.path_for("hub", "kernel-hub/norm", "v1");
  fs::write_file_atomic(p, "{broken");
  EXPECT_FALSE(state.read("hub", "kernel-hub/norm", "v1").has_value());
  // A record copied to another tag's path does not lend that tag its serial.
  SerialRecord r{"hub", "kernel-hub/norm", "v2", 9, index_digest(), kNow, kNow, "k", {"k"}};
  state.write(r);
  stdfs::copy_file(state.path_for("hub", "kernel-hub/norm", "v2"), p,
                   stdfs::copy_options::overwrite_existing);
  EXPECT_FALSE(state.read("hub", "kernel-hub/norm", "v1").has_value());
  EXPECT_TRUE(state.read("hub", "kernel-hub/norm", "v2").has_value());
}

// --- verify_trust ----------------------------------------------------------------------------

class TrustVerify : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = TrustStore::open(dir_ / "trust");
    store_.add(key_.public_key(), {"kernel-hub/*"});
  }

  TrustRequest request(const std::string& tag = "v1", bool offline = false) {
    TrustRequest r;
    r.ref_text = kRef;
    r.repo = "kernel-hub/norm";
    r.tag = tag;
    r.index = index_digest();
    r.offline = offline;
    return r;
  }

  SignatureSet signed_set(const Statement& s, const PrivateKey* key = nullptr) {
    SignatureSet set;
    set.envelopes.push_back(sign_statement(s, key ? *key : key_));
    return set;
  }

  TrustDecision verify(const TrustRequest& req, const SignatureSet& sigs,
                       const TrustPolicy& policy = {}, int64_t now = kNow) {
    return verify_trust(req, sigs, store_, state_, policy, now);
  }

  void expect_refused(const TrustRequest& req, const SignatureSet& sigs,
                      const std::vector<std::string>& needles, const TrustPolicy& policy = {},
                      int64_t now = kNow) {
    std::vector<std::string> all{std::string(req.ref_text) + ": refused: "};
    all.insert(all.end(), needles.begin(), needles.end());
    expect_error([&] { verify(req, sigs, policy, now); }, ErrorKind::kRefused, all);
  }

  std::optional<SerialRecord> stored(const std::string& tag = "v1") {
    return TrustState(dir_.path()).read("kernel-hub.dev", "kernel-hub/norm", tag);
  }

  TempDir dir_;
  PrivateKey key_ = PrivateKey::generate();
  TrustStore store_;
  TrustState state_{dir_.path()};
};

TEST_F(TrustVerify, AcceptsAValidSignatureAndPersistsItsSerial) {
  TrustDecision d = verify(request(), signed_set(statement(5)));
  EXPECT_TRUE(d.signed_ok);
  EXPECT_FALSE(d.unsigned_allowed);
  EXPECT_FALSE(d.in_grace);
  EXPECT_TRUE(d.warning.empty());
  EXPECT_EQ(d.key_id, key_.public_key().key_id());
  EXPECT_EQ(d.hub_id, "kernel-hub.dev");
  EXPECT_EQ(d.serial, 5u);
  EXPECT_EQ(d.expires, kNow + kDay);
  auto rec = stored();
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->serial, 5u);
  EXPECT_EQ(rec->index, index_digest());
  EXPECT_EQ(rec->seen_at, kNow);
  // Verifying again (same serial, same index) is fine.
  EXPECT_TRUE(verify(request(), signed_set(statement(5))).signed_ok);
}

TEST_F(TrustVerify, UnsignedIsRefusedByDefault) {
  expect_refused(request(), SignatureSet{},
                 {"not signed (no signature for index " + index_digest().str() + ")",
                  "kernel-hub sign --key KEY kernel-hub/norm@v1", "kernel-hub trust add",
                  "KERNEL_HUB_ALLOW_UNSIGNED=1"});
  EXPECT_FALSE(stored().has_value());
}

TEST_F(TrustVerify, UnsignedIsAllowedWithAWarningWhenThePolicySaysSo) {
  TrustPolicy policy;
  policy.allow_unsigned = true;
  TrustDecision d = verify(request(), SignatureSet{}, policy);
  EXPECT_FALSE(d.signed_ok);
  EXPECT_TRUE(d.unsigned_allowed);
  EXPECT_EQ(d.warning,
            "loading UNSIGNED package kernel-hub/norm@v1 (not signed (no signature "
            "for index " +
                index_digest().str() + ")): KERNEL_HUB_ALLOW_UNSIGNED/--allow-unsigned is set");
  // A failing signature is reported the same way, with its reason.
  PrivateKey stranger = PrivateKey::generate();
  d = verify(request(), signed_set(statement(), &stranger), policy);
  EXPECT_TRUE(d.unsigned_allowed);
  EXPECT_NE(d.warning.find("not trusted"), std::string::npos) << d.warning;
}

TEST_F(TrustVerify, RefusesAnUntrustedKey) {
  PrivateKey stranger = PrivateKey::generate();
  std::string id = stranger.public_key().key_id();
  expect_refused(request(), signed_set(statement(), &stranger),
                 {"signature by key " + id.substr(0, 16) + "... which is not trusted",
                  "kernel-hub trust ls", "KERNEL_HUB_ALLOW_UNSIGNED=1"});
}

TEST_F(TrustVerify, RefusesAKeyTrustedForOtherRepositories) {
  PrivateKey org_key = PrivateKey::generate();
  store_.add(org_key.public_key(), {"org/*", "other/name"});
  expect_refused(request(), signed_set(statement(), &org_key),
                 {"key " + org_key.public_key().key_id().substr(0, 16) +
                      "... is trusted only for org/*, other/name, not for kernel-hub/norm",
                  "kernel-hub trust add"});
}

TEST_F(TrustVerify, RefusesAStatementForAnotherRepositoryHubOrTag) {
  expect_refused(request(),
                 signed_set(statement(5, "v1", index_digest(), kNow + kDay, "kernel-hub/other")),
                 {"the signature is for repository kernel-hub/other, not kernel-hub/norm",
                  "packed under another name", "signs it for kernel-hub/norm"});
  expect_refused(request(), signed_set(statement(5, "v2")),
                 {"the signature is for tag v2, not v1"});
  TrustRequest req = request();
  req.hub_id = "mirror.example";
  expect_refused(req, signed_set(statement()),
                 {"the signature is for hub kernel-hub.dev, not mirror.example"});
  EXPECT_FALSE(stored().has_value());
  EXPECT_FALSE(stored("v2").has_value());
}

TEST_F(TrustVerify, ADigestPinAcceptsAnyTagAndKeepsNoSerial) {
  TrustRequest pin = request("");
  pin.ref_text = "kernel-hub/norm@" + index_digest().str();
  TrustDecision d = verify(pin, signed_set(statement(2, "1.0.0")));
  EXPECT_TRUE(d.signed_ok);
  EXPECT_EQ(d.tag, "1.0.0");
  EXPECT_FALSE(stored("1.0.0").has_value());
}

TEST_F(TrustVerify, RefusesADigestMismatch) {
  TrustRequest req = request();
  req.index = index_digest("tampered index bytes");
  expect_refused(
      req, signed_set(statement()),
      {"signed index digest " + index_digest().str() + " but the hub served " + req.index.str()});
}

TEST_F(TrustVerify, RefusesATamperedStatementOrSignature) {
  SignatureSet set = signed_set(statement());
  SignatureSet bad_statement = set;
  bad_statement.envelopes[0].statement[kCanonical.find("\n5\n") + 1] = '9';  // serial 5 -> 9
  expect_refused(request(), bad_statement, {"bad signature by key", "altered"});
  SignatureSet bad_sig = set;
  bad_sig.envelopes[0].sigs[0].second[10] ^= 0x40;
  expect_refused(request(), bad_sig, {"bad signature by key"});
  // The message must not suggest the development escape after a forgery.
  try {
    verify(request(), bad_sig);
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("ALLOW_UNSIGNED"), std::string::npos) << e.what();
  }
}

TEST_F(TrustVerify, RefusesAValidlySignedButMalformedStatement) {
  std::string bytes = kCanonical + "extra\n";
  SignatureSet set;
  set.envelopes.push_back(Envelope{bytes, {{key_.public_key().key_id(), key_.sign(bytes)}}});
  expect_refused(request(), set, {"malformed signed statement", "8 lines"});
}

TEST_F(TrustVerify, ExpiryOnlineAndOffline) {
  const int64_t expired_at = kNow - 3600;
  SignatureSet set = signed_set(statement(5, "v1", index_digest(), expired_at));
  expect_refused(request(), set,
                 {"statement expired at 2025-12-31T23:00:00Z", "now 2026-01-01T00:00:00Z"});
  // Within the clock skew allowance it is still valid.
  EXPECT_TRUE(verify(request(), set, {}, expired_at + 299).signed_ok);
  EXPECT_FALSE(verify(request(), set, {}, expired_at + 299).in_grace);

  // Offline within the grace period: accepted, flagged, with a warning that says how long.
  TrustDecision d = verify(request("v1", true), set);
  EXPECT_TRUE(d.signed_ok);
  EXPECT_TRUE(d.in_grace);
  EXPECT_NE(d.warning.find(kRef), std::string::npos) << d.warning;
  EXPECT_NE(d.warning.find("grace period of 7d (6d 23h left)"), std::string::npos) << d.warning;

  // Offline beyond the grace period: refused.
  TrustPolicy short_grace;
  short_grace.offline_grace_s = 1800;
  expect_refused(request("v1", true), set,
                 {"statement expired at 2025-12-31T23:00:00Z",
                  "beyond the offline grace period of 30m", "KERNEL_HUB_OFFLINE_GRACE"},
                 short_grace);
  expect_refused(request("v1", true), set, {"beyond the offline grace period of 7d"}, {},
                 expired_at + 8 * kDay);
}

TEST_F(TrustVerify, RefusesRollback) {
  ASSERT_TRUE(verify(request(), signed_set(statement(5))).signed_ok);
  // An older serial replayed, even for the same index.
  expect_refused(request(), signed_set(statement(3)),
                 {"rollback: serial 3 is older than serial 5 seen before"});
  // The same serial naming another index.
  TrustRequest other = request();
  other.index = index_digest("other");
  expect_refused(other, signed_set(statement(5, "v1", other.index)),
                 {"rollback: serial 5 was seen before for index " + index_digest().str()});
  // A newer serial moves the state forward; the old one is then refused from a fresh object.
  ASSERT_TRUE(verify(other, signed_set(statement(6, "v1", other.index))).signed_ok);
  EXPECT_EQ(stored()->serial, 6u);
  TrustState fresh(dir_.path());
  expect_error([&] { verify_trust(request(), signed_set(statement(5)), store_, fresh, {}, kNow); },
               ErrorKind::kRefused, {kRef, "rollback: serial 5 is older than serial 6"});
  // Rollback is per tag: another tag has its own serial.
  EXPECT_TRUE(verify(request("1.0.0"), signed_set(statement(1, "1.0.0"))).signed_ok);
  // Not per hub id alone: the signer names it, so the same key's older statement under another
  // one is refused too...
  Statement elsewhere = statement(4);
  elsewhere.hub_id = "another-hub";
  expect_refused(request(), signed_set(elsewhere),
                 {"rollback: serial 4 is older than serial 6", "hub id kernel-hub.dev"});
  // ...unless it signs the same index (one publisher pushing one index to two hubs signs it with
  // two serials; the older is not a rollback)...
  Statement same_index = statement(4, "v1", other.index);
  same_index.hub_id = "second-hub";
  EXPECT_TRUE(verify(other, signed_set(same_index)).signed_ok);
  // ...while another key's statements (another build tree's default hub, another publisher)
  // keep their own count, even for the same index.
  PrivateKey second = PrivateKey::generate();
  store_.add(second.public_key(), {"kernel-hub/*"});
  SignatureSet theirs;
  theirs.envelopes.push_back(sign_statement(elsewhere, second));
  EXPECT_TRUE(verify(request(), theirs).signed_ok);
}

// A statement signed by several trusted keys counts in each one's history: the hub orders the
// signatures, so reordering them (or dropping one) must not let an older statement under another
// hub id start a fresh count.
TEST_F(TrustVerify, ACoSignedStatementCountsForEverySigner) {
  PrivateKey second = PrivateKey::generate();
  store_.add(second.public_key(), {"kernel-hub/*"});
  TrustRequest current = request();
  current.index = index_digest("current");
  Envelope newest = sign_statement(statement(6, "v1", current.index), key_);
  newest.add_signature(second);
  SignatureSet set;
  set.envelopes.push_back(newest);
  ASSERT_TRUE(verify(current, set).signed_ok);
  auto rec = stored();
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->key_ids,
            (std::vector<std::string>{key_.public_key().key_id(), second.public_key().key_id()}));

  Statement older = statement(4);  // another index, under another hub id
  older.hub_id = "another-hub";
  Envelope reordered = sign_statement(older, second);  // `second` first this time
  reordered.add_signature(key_);
  SignatureSet replay;
  replay.envelopes.push_back(reordered);
  expect_refused(request(), replay, {"rollback: serial 4 is older than serial 6"});
  expect_refused(request(), signed_set(older, &second),
                 {"rollback: serial 4 is older than serial 6"});
  // A key that signed none of it keeps its own count.
  PrivateKey third = PrivateKey::generate();
  store_.add(third.public_key(), {"kernel-hub/*"});
  EXPECT_TRUE(verify(request(), signed_set(older, &third)).signed_ok);
}

// However the signatures come (one envelope per signer as `kernel-hub sign` writes them, a
// signature missing at first and shown later, separate statements for one index), every trusted
// key that vouched for the index has its own history, and a later statement by another key does
// not erase it.
TEST_F(TrustVerify, EveryKeysHistoryIsKeptWhateverTheEnvelopes) {
  PrivateKey second = PrivateKey::generate();
  store_.add(second.public_key(), {"kernel-hub/*"});
  TrustRequest current = request();
  current.index = index_digest("current");
  Statement older = statement(4);  // another index, under another hub id
  older.hub_id = "another-hub";
  const std::vector<std::string> rollback = {"rollback: serial 4 is older than serial"};
  auto fresh_state = [&] {
    stdfs::remove_all(dir_.path() / "kernel-hub.dev");
    stdfs::remove_all(dir_.path() / ".keys");
  };

  // Split: the same statement in one envelope per signer.
  SignatureSet split;
  split.envelopes.push_back(sign_statement(statement(6, "v1", current.index), key_));
  split.envelopes.push_back(sign_statement(statement(6, "v1", current.index), second));
  ASSERT_TRUE(verify(current, split).signed_ok);
  expect_refused(request(), signed_set(older, &second), rollback);
  expect_refused(request(), signed_set(older, &key_), rollback);

  // Separate statements for the one index: the lower serial's signer is counted too.
  fresh_state();
  SignatureSet separate;
  separate.envelopes.push_back(sign_statement(statement(6, "v1", current.index), key_));
  separate.envelopes.push_back(sign_statement(statement(7, "v1", current.index), second));
  ASSERT_TRUE(verify(current, separate).signed_ok);
  expect_refused(request(), signed_set(older, &key_), rollback);

  // A signature missing at first, shown later for the same statement.
  fresh_state();
  Envelope newest = sign_statement(statement(6, "v1", current.index), key_);
  SignatureSet one;
  one.envelopes.push_back(newest);
  ASSERT_TRUE(verify(current, one).signed_ok);
  newest.add_signature(second);
  SignatureSet both;
  both.envelopes.push_back(newest);
  ASSERT_TRUE(verify(current, both).signed_ok);
  expect_refused(request(), signed_set(older, &second), rollback);

  // Another key's later statement for another index leaves the first key's history in place.
  TrustRequest next = request();
  next.index = index_digest("next");
  ASSERT_TRUE(verify(next, signed_set(statement(8, "v1", next.index), &second)).signed_ok);
  EXPECT_EQ(stored()->key_ids, std::vector<std::string>{second.public_key().key_id()});
  expect_refused(request(), signed_set(older, &key_), rollback);
}

// Records written before key_ids was kept count for their one key_id.
TEST(TrustStateFiles, AnOlderRecordCountsForItsOneKey) {
  TempDir dir;
  TrustState state(dir.path());
  const std::string key(64, 'a');
  stdfs::create_directories(dir.path() / "old-hub" / "kernel-hub" / "norm");
  std::ofstream(dir.path() / "old-hub" / "kernel-hub" / "norm" / "v1.json")
      << R"({"hub_id": "old-hub", "repo": "kernel-hub/norm", "tag": "v1", "serial": 7, "index": ")"
      << index_digest().str() << R"(", "expires": 1, "seen_at": 1, "key_id": ")" << key << R"("})";
  auto r = state.read_highest("kernel-hub/norm", "v1", {std::string(64, 'b'), key});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->serial, 7u);
  EXPECT_EQ(r->key_ids, std::vector<std::string>{key});
  EXPECT_FALSE(state.read_highest("kernel-hub/norm", "v1", {std::string(64, 'b')}).has_value());
}

TEST_F(TrustVerify, PicksTheHighestValidSerialAndReportsTheFurthestFailure) {
  PrivateKey stranger = PrivateKey::generate();
  SignatureSet set;
  set.envelopes.push_back(sign_statement(statement(9), stranger));  // untrusted
  set.envelopes.push_back(sign_statement(statement(4), key_));
  set.envelopes.push_back(sign_statement(statement(7), key_));
  set.envelopes.push_back(sign_statement(statement(8, "v2"), key_));  // other tag
  TrustDecision d = verify(request(), set);
  EXPECT_TRUE(d.signed_ok);
  EXPECT_EQ(d.serial, 7u);
  EXPECT_EQ(stored()->serial, 7u);

  // None valid: the message is about the envelope that got furthest (the digest check).
  SignatureSet failing;
  failing.envelopes.push_back(sign_statement(statement(9), stranger));
  failing.envelopes.push_back(sign_statement(statement(9, "v1", index_digest("x")), key_));
  failing.envelopes.push_back(sign_statement(statement(9, "v2"), key_));
  expect_refused(request(), failing,
                 {"signed index digest " + index_digest("x").str(), "furthest of 3"});
}

TEST_F(TrustVerify, CoSignedEnvelopeNeedsOneTrustedValidSigner) {
  PrivateKey stranger = PrivateKey::generate();
  Envelope env = sign_statement(statement(), stranger);
  env.add_signature(key_);
  SignatureSet set;
  set.envelopes.push_back(env);
  TrustDecision d = verify(request(), set);
  EXPECT_TRUE(d.signed_ok);
  EXPECT_EQ(d.key_id, key_.public_key().key_id());
}

TEST(TrustPolicyEnv, ReadsTheEnvironmentStrictly) {
  {
    ScopedEnv a("KERNEL_HUB_ALLOW_UNSIGNED", std::nullopt);
    ScopedEnv b("KERNEL_HUB_OFFLINE_GRACE", std::nullopt);
    TrustPolicy p = TrustPolicy::from_env();
    EXPECT_FALSE(p.allow_unsigned);
    EXPECT_EQ(p.offline_grace_s, 7 * kDay);
  }
  {
    ScopedEnv a("KERNEL_HUB_ALLOW_UNSIGNED", "1");
    ScopedEnv b("KERNEL_HUB_OFFLINE_GRACE", "60");
    TrustPolicy p = TrustPolicy::from_env();
    EXPECT_TRUE(p.allow_unsigned);
    EXPECT_EQ(p.offline_grace_s, 60);
  }
  {
    ScopedEnv a("KERNEL_HUB_ALLOW_UNSIGNED", "0");
    EXPECT_FALSE(TrustPolicy::from_env().allow_unsigned);
  }
  {
    ScopedEnv a("KERNEL_HUB_ALLOW_UNSIGNED", "maybe");
    expect_error([] { TrustPolicy::from_env(); }, ErrorKind::kInvalidInput,
                 {"KERNEL_HUB_ALLOW_UNSIGNED='maybe'"});
  }
  for (const char* bad : {"-1", "1d", " 5", "99999999999999999999"}) {
    ScopedEnv a("KERNEL_HUB_ALLOW_UNSIGNED", std::nullopt);
    ScopedEnv b("KERNEL_HUB_OFFLINE_GRACE", bad);
    expect_error([] { TrustPolicy::from_env(); }, ErrorKind::kInvalidInput,
                 {"KERNEL_HUB_OFFLINE_GRACE"});
  }
}

}  // namespace
}  // namespace kh::trust
