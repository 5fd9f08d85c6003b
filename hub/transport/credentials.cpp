#include "hub/transport/credentials.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "hub/base/env.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/base/log.h"
#include "hub/oci/address.h"
#include "hub/transport/docker_config.h"

extern char** environ;

namespace kh {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxConfigBytes = 4 << 20;
constexpr size_t kMaxHelperOutput = 64 << 10;

std::string lower_ascii(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The host[:port] KERNEL_HUB_USERNAME/KERNEL_HUB_PASSWORD belong to: KERNEL_HUB_CREDENTIALS_HOST
// (host[:port], a scheme or path around it ignored), else the registry KERNEL_HUB_ENDPOINT names
// (oci://HOST[:PORT]), else "" (they go to no host). Lower-case: host names are.
std::string env_credentials_host() {
  if (std::string h = env_string("KERNEL_HUB_CREDENTIALS_HOST"); !h.empty()) {
    if (size_t s = h.find("://"); s != std::string::npos) h.erase(0, s + 3);
    return lower_ascii(h.substr(0, h.find('/')));
  }
  std::string endpoint = env_string("KERNEL_HUB_ENDPOINT");
  if (endpoint.empty()) return "";
  try {
    HubAddress a = HubAddress::parse(endpoint, false);
    if (a.kind == HubAddress::Kind::kRegistry) return lower_ascii(a.host);
  } catch (const Error&) {  // the hub facade reports a malformed endpoint where it uses it
  }
  return "";
}

bool env_credentials_set() {
  return !env_string("KERNEL_HUB_USERNAME").empty();
}

// Why the environment's credentials were not sent to `host` ("" when they were, or are unset).
std::string env_credentials_note(const std::string& host) {
  if (!env_credentials_set()) return "";
  const std::string scoped = env_credentials_host();
  if (scoped == lower_ascii(host)) return "";
  return "KERNEL_HUB_USERNAME/KERNEL_HUB_PASSWORD are set but were not sent to " + host +
         (scoped.empty() ? ": they go only to the registry named by KERNEL_HUB_ENDPOINT "
                           "(oci://HOST[:PORT]) or by KERNEL_HUB_CREDENTIALS_HOST, and neither "
                           "names one"
                         : ": they are scoped to " + scoped +
                               " (KERNEL_HUB_CREDENTIALS_HOST, else the registry of "
                               "KERNEL_HUB_ENDPOINT)") +
         "; set KERNEL_HUB_CREDENTIALS_HOST=" + host + " to send them there";
}

std::optional<Credentials> from_kernel_hub_file(const std::string& host) {
  const std::filesystem::path path = credentials_file();
  std::optional<std::string> text = fs::read_file_if_exists(path, kMaxConfigBytes);
  if (!text) return std::nullopt;
  const std::string expected =
      R"(; expected {"HOST[:PORT]": {"username": "...", "password": "..."}})";
  json doc;
  try {
    doc = json::parse(*text);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kInvalidInput, "credentials file " + path.string() +
                                              " is not valid JSON (" + e.what() + ")" + expected);
  }
  if (!doc.is_object()) {
    throw Error(ErrorKind::kInvalidInput,
                "credentials file " + path.string() + " is not a JSON object" + expected);
  }
  std::string bare_host = host.substr(0, host.rfind(':'));
  for (const std::string& key : {host, bare_host}) {
    if (!doc.contains(key)) continue;
    const json& e = doc[key];
    if (!e.is_object() || !e.contains("username") || !e["username"].is_string() ||
        (e.contains("password") && !e["password"].is_string())) {
      throw Error(ErrorKind::kInvalidInput, "credentials file " + path.string() + ": entry '" +
                                                key + "' is malformed" + expected);
    }
    return Credentials{e["username"].get<std::string>(), e.value("password", std::string()), "", "",
                       path.string()};
  }
  return std::nullopt;
}

// $HOME (else the password database's) for the docker and containers files; "" when none: those
// files are optional.
std::filesystem::path home_file(const char* override_var, const char* xdg_var,
                                const char* home_subdir, const char* leaf) {
  try {
    return user_dir(override_var, xdg_var, home_subdir, leaf);
  } catch (const Error&) {
    return {};
  }
}

// The docker-format files in the order they are consulted (see credentials.h).
std::vector<std::filesystem::path> docker_format_files() {
  std::vector<std::filesystem::path> files;
  if (std::string f = env_string("REGISTRY_AUTH_FILE"); !f.empty()) {
    files.emplace_back(f);
  } else {
    if (std::string run = env_string("XDG_RUNTIME_DIR"); !run.empty() && run.front() == '/') {
      files.push_back(std::filesystem::path(run) / "containers/auth.json");
    }
    // No override variable: REGISTRY_AUTH_FILE was handled above.
    if (auto p = home_file("", "XDG_CONFIG_HOME", ".config", "containers/auth.json"); !p.empty())
      files.push_back(p);
  }
  if (std::string d = env_string("DOCKER_CONFIG"); !d.empty()) {
    files.push_back(std::filesystem::path(d) / "config.json");
  } else if (auto p = home_file("", "", ".docker", "config.json"); !p.empty()) {
    files.push_back(p);
  }
  return files;
}

std::string one_line(std::string s, size_t max = 300) {
  s = s.substr(0, max);
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// The server URL a helper is asked about: what docker stores, host[:port] (docker Hub's legacy
// URL for docker.io).
std::string helper_server_url(const std::string& host) {
  return registry_key_host(host) == "docker.io" ? "https://index.docker.io/v1/" : host;
}

// Runs `docker-credential-<name> get` with the server URL on stdin: no shell, a deadline
// (KERNEL_HUB_CREDENTIAL_HELPER_TIMEOUT_S, default 30 s), at most kMaxHelperOutput bytes read.
// nullopt when the helper has no credentials for the server. `why` names the config entry.
std::optional<AuthEntry> run_helper(const std::string& name, const std::string& host,
                                    const std::string& why) {
  const std::string program = "docker-credential-" + name;
  const std::string what = "credential helper " + program + " (" + why + ")";
  const long timeout_s = env_long("KERNEL_HUB_CREDENTIAL_HELPER_TIMEOUT_S", 30, 1);
  // stdout carries the reply; stderr is kept apart (helpers print warnings there, which docker
  // ignores too) and only shown in a failure's message.
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    int e = errno;
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]})
      if (fd >= 0) ::close(fd);
    errno = e;
    throw_errno("cannot run " + what);
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group, so that a timeout kills whatever it started too.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<std::string> args = {program, "get"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, program.c_str(), &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    ::close(err[0]);
    if (rc == ENOENT) {
      // A config copied from another machine often names a helper this one lacks (docker
      // Desktop's "desktop"): public registries must still work anonymously, so warn and go on;
      // a registry that needs credentials then fails with the hint.
      log_warning("cannot run " + what +
                  ": it is not on PATH; install it, or remove the entry "
                  "from that file; going on without its credentials");
      return std::nullopt;
    }
    throw Error(ErrorKind::kAuth, "cannot run " + what + ": " + std::strerror(rc));
  }
  const std::string request = helper_server_url(host) + "\n";
  {
    // A helper that exits without reading must not kill us with SIGPIPE (MSG_NOSIGNAL is for
    // sockets only): block it for this thread, and drop one raised by this write.
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    ssize_t w = ::write(in[1], request.data(), request.size());
    if (w < 0 && errno == EPIPE) {
      timespec zero{};
      sigtimedwait(&pipe_set, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    ::close(in[1]);
  }

  // Both pipes read until the helper closes them, then its exit awaited: all within the
  // deadline (a helper that closes its output and lingers is killed too), at most
  // kMaxHelperOutput bytes from each.
  std::string output, errors;
  bool timed_out = false, too_long = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  auto ms_left = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now())
        .count();
  };
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&output, &errors};
  while ((fds[0].fd >= 0 || fds[1].fd >= 0) && !too_long) {
    const long long left = ms_left();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    int n = ::poll(fds, 2, static_cast<int>(std::min<long long>(left, 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;  // poll skips negative descriptors
        continue;
      }
      sinks[i]->append(buf, static_cast<size_t>(got));
      too_long = too_long || sinks[i]->size() > kMaxHelperOutput;
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int status = 0;
  for (bool killed = false;;) {
    if (!killed && (timed_out || too_long)) {
      ::kill(-pid, SIGKILL);
      killed = true;
    }
    pid_t w = ::waitpid(pid, &status, killed ? 0 : WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    if (w == 0) {
      if (ms_left() <= 0) {
        timed_out = true;
        continue;
      }
      ::usleep(10000);
    }
  }
  if (timed_out) {
    throw Error(ErrorKind::kAuth, what + " did not answer within " + std::to_string(timeout_s) +
                                      " s; check it works (`echo " + helper_server_url(host) +
                                      " | " + program +
                                      " get`) or raise KERNEL_HUB_CREDENTIAL_HELPER_TIMEOUT_S");
  }
  if (too_long) {
    throw Error(ErrorKind::kAuth, what + " printed more than " + std::to_string(kMaxHelperOutput) +
                                      " bytes; refusing it");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    // docker-credential-helpers' "credentials not found in native keychain".
    if (lower_ascii(output + errors).find("credentials not found") != std::string::npos)
      return std::nullopt;
    throw Error(ErrorKind::kAuth,
                what + " failed (" +
                    (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                       : "killed by signal " + std::to_string(WTERMSIG(status))) +
                    "): " + one_line(errors.empty() ? output : errors) + "; run `echo " +
                    helper_server_url(host) + " | " + program +
                    " get` to see why, or log in again");
  }
  AuthEntry a = parse_helper_reply(output, what);
  if (a.empty()) return std::nullopt;
  return a;
}

Credentials to_credentials(const AuthEntry& a, std::string origin) {
  return Credentials{a.username, a.password, a.identity_token, a.registry_token, std::move(origin)};
}

// The host's credentials in one docker-format file: its credHelpers entry, then credsStore, then
// its auths entry (see credentials.h).
std::optional<Credentials> from_docker_format_file(const std::filesystem::path& path,
                                                   const std::string& host) {
  std::optional<std::string> text;
  try {
    text = fs::read_file_if_exists(path, kMaxConfigBytes);
  } catch (const Error& e) {
    throw Error(e.kind(), std::string(e.what()) +
                              "; fix its permissions or point REGISTRY_AUTH_FILE / DOCKER_CONFIG "
                              "elsewhere");
  }
  if (!text) return std::nullopt;
  const DockerConfig config = parse_docker_config(*text, path.string());
  if (std::string helper = config.helper_for(host); !helper.empty()) {
    std::string why = "credHelpers entry for " + host + " in " + path.string();
    if (auto a = run_helper(helper, host, why))
      return to_credentials(*a, "docker-credential-" + helper);
  }
  if (!config.creds_store.empty()) {
    std::string why = "credsStore in " + path.string();
    if (auto a = run_helper(config.creds_store, host, why))
      return to_credentials(*a, "docker-credential-" + config.creds_store);
  }
  if (auto a = config.auth_for(host); a && !a->empty()) return to_credentials(*a, path.string());
  return std::nullopt;
}

}  // namespace

std::filesystem::path credentials_file() {
  return user_dir("KERNEL_HUB_CREDENTIALS", "XDG_CONFIG_HOME", ".config",
                  "kernel-hub/credentials.json");
}

std::optional<Credentials> load_credentials(const SourceOptions& o, const std::string& host) {
  if (!o.username.empty()) {
    return Credentials{o.username, o.password, "", "", "options"};
  }
  if (env_credentials_set() && env_credentials_host() == lower_ascii(host)) {
    return Credentials{env_string("KERNEL_HUB_USERNAME"), env_string("KERNEL_HUB_PASSWORD"), "", "",
                       "KERNEL_HUB_USERNAME/KERNEL_HUB_PASSWORD"};
  }
  if (auto c = from_kernel_hub_file(host)) return c;
  for (const auto& file : docker_format_files()) {
    if (auto c = from_docker_format_file(file, host)) return c;
  }
  return std::nullopt;
}

std::string credentials_hint(const std::string& host) {
  std::string hint =
      "log in with `docker login " + host + "` or `podman login " + host +
      "` (kernel-hub reads ~/.docker/config.json, $DOCKER_CONFIG, containers/auth.json and "
      "$REGISTRY_AUTH_FILE, with their credential helpers), or set "
      "KERNEL_HUB_USERNAME/KERNEL_HUB_PASSWORD (with KERNEL_HUB_ENDPOINT or "
      "KERNEL_HUB_CREDENTIALS_HOST naming " +
      host + "), or add \"" + host + "\" to the credentials file " + credentials_file().string() +
      R"( ({"HOST[:PORT]": {"username": "...", "password": "..."}}))";
  std::string note = env_credentials_note(host);
  return note.empty() ? hint : note + "; or " + hint;
}

}  // namespace kh
