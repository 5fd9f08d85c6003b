#include "loader/package_check.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include <fmt/format.h>

#include "hub/base/error.h"
#include "loader/package_dir.h"

namespace kh {

namespace {

// More than any honest report (a table has at most 4096 layers and ops of short strings).
constexpr size_t kMaxReportBytes = 16u << 20;
constexpr const char* kIsolatedLoad = "isolated-load";

nlohmann::json flag_list(uint32_t flags) {
  nlohmann::json a = nlohmann::json::array();
  if (flags & KH_FLAG_HAS_BACKWARD) a.push_back("HAS_BACKWARD");
  if (flags & KH_FLAG_GRAPH_SAFE) a.push_back("GRAPH_SAFE");
  if (flags & KH_FLAG_DETERMINISTIC) a.push_back("DETERMINISTIC");
  if (flags & KH_FLAG_INFERENCE_ONLY) a.push_back("INFERENCE_ONLY");
  return a;
}

nlohmann::json dtype_list(uint32_t dtypes) {
  nlohmann::json a = nlohmann::json::array();
  if (dtypes & KH_DTYPE_BF16) a.push_back("bf16");
  if (dtypes & KH_DTYPE_FP16) a.push_back("fp16");
  if (dtypes & KH_DTYPE_FP32) a.push_back("fp32");
  return a;
}

const char* or_dash(const char* s) {
  return s ? s : "-";
}

nlohmann::json or_null(const char* s) {
  return s ? nlohmann::json(s) : nlohmann::json(nullptr);
}

// ---- the child: load, read the table, report ----------------------------------------------

// The raw table fields, enough to rebuild the table in the parent.
nlohmann::json table_report(const ModuleView& v) {
  nlohmann::json layers = nlohmann::json::array(), ops = nlohmann::json::array();
  for (const kh_layer_v1_t* l : v.layers)
    layers.push_back({{"name", l->name},
                      {"forward", or_null(l->forward)},
                      {"forward_train", or_null(l->forward_train)},
                      {"backward", or_null(l->backward)},
                      {"flags", l->flags},
                      {"dtypes", l->dtypes}});
  for (const kh_op_v1_t* op : v.ops)
    ops.push_back({{"name", op->name}, {"schema", op->schema}, {"flags", op->flags}});
  return {{"name", v.name},           {"version", v.version}, {"build_id", v.build_id},
          {"abi_minor", v.abi_minor}, {"layers", layers},     {"ops", ops}};
}

bool write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Runs in the forked child: the only place the library's code runs. Never returns.
[[noreturn]] void child_main(const std::filesystem::path& library, int fd) {
  // The library may print: keep its output off the parent's stdout (which may carry --json).
  dup2(STDERR_FILENO, STDOUT_FILENO);
  rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);  // a crash here is reported, not dumped
  int status = 0;
  try {
    LoadResult r = try_load_module(library);
    nlohmann::json j;
    j["file"] = r.report.file;
    nlohmann::json checks = nlohmann::json::array();
    for (const auto& c : r.report.checks)
      checks.push_back(
          {{"name", c.name}, {"passed", c.passed}, {"warning", c.warning}, {"message", c.message}});
    j["checks"] = checks;
    if (r.module) j["module"] = table_report(r.module->view);
    // Package strings need not be UTF-8: replace what is not, rather than throw.
    if (!write_all(fd, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)))
      status = 4;
  } catch (...) {
    status = 3;
  }
  // _exit: no atexit handlers or static destructors of the parent's state, no stdio flush.
  _exit(status);
}

// ---- the parent: run the child, collect its report ----------------------------------------

struct ChildOutcome {
  std::string report;   // the child's JSON when it exited 0
  std::string failure;  // why there is no report
};

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  const char* what = strsignal(sig);
  return fmt::format("{} ({})",
                     abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig),
                     what ? what : "unknown signal");
}

std::string seconds(std::chrono::milliseconds ms) {
  return fmt::format("{:g} s", static_cast<double>(ms.count()) / 1000.0);
}

ChildOutcome run_in_child(const std::filesystem::path& library, std::chrono::milliseconds timeout) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return {{}, fmt::format("cannot create a pipe for the checker process: {}", strerror(errno))};
  // Whatever is buffered would be written twice if the child flushed it too.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(fds[0]);
    close(fds[1]);
    return {{}, fmt::format("cannot start the checker process: {}", strerror(err))};
  }
  if (pid == 0) {
    close(fds[0]);
    setpgid(0, 0);  // its own group, so that anything it starts is killed with it
    child_main(library, fds[1]);
  }
  setpgid(pid, pid);  // also here: whichever runs first wins, the other fails harmlessly
  close(fds[1]);

  std::string data;
  bool eof = false, exited = false, overflow = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!exited && !overflow) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    // Wait for output; once the pipe is closed, only for the exit (closing comes just before).
    pollfd p{fds[0], POLLIN, 0};
    int wait_ms = static_cast<int>(std::min<int64_t>(left.count(), eof ? 2 : 100));
    if (poll(&p, eof ? 0 : 1, wait_ms) > 0) {
      char buf[65536];
      ssize_t n = read(fds[0], buf, sizeof buf);
      if (n > 0) {
        data.append(buf, static_cast<size_t>(n));
        overflow = data.size() > kMaxReportBytes;
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        eof = true;
      }
    }
    // Exited, but not reaped yet: the group stays valid for the kill below.
    siginfo_t info{};
    exited = waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
  }
  if (exited && !eof && !overflow) {
    // The child wrote everything before it exited; take what is left in the pipe. (Something
    // it started may still hold the pipe open, so do not wait for end of file.)
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    char buf[65536];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0 && data.size() <= kMaxReportBytes)
      data.append(buf, static_cast<size_t>(n));
    overflow = data.size() > kMaxReportBytes;
  }
  close(fds[0]);
  kill(-pid, SIGKILL);  // the child's group: whatever it left behind
  kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }

  if (overflow)
    return {{},
            fmt::format("the checker process sent more than {} MiB; a constructor or "
                        "kh_module_v1 wrote to the report pipe",
                        kMaxReportBytes >> 20)};
  if (!exited)
    return {{},
            fmt::format("loading the library did not finish within {} (a constructor or "
                        "kh_module_v1 hangs); the checker process was killed",
                        seconds(timeout))};
  if (WIFSIGNALED(status))
    return {{},
            fmt::format("the library crashed the checker: {} while loading it or reading "
                        "its module table (in ld.so, a constructor or kh_module_v1); run it "
                        "under a debugger to see where",
                        signal_name(WTERMSIG(status)))};
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return {{},
            fmt::format("the checker process exited with status {} before it reported (a "
                        "constructor or kh_module_v1 called exit?)",
                        WIFEXITED(status) ? WEXITSTATUS(status) : -1)};
  if (data.empty())
    return {{},
            "the checker process exited without a report (a constructor or kh_module_v1 "
            "called exit?)"};
  return {std::move(data), {}};
}

int32_t not_loaded_here(const kh_arg_t*, int32_t, void*) {
  return KH_ERR_UNSUPPORTED;
}

const char* keep(CheckedModule& m, const nlohmann::json& v) {
  if (v.is_null()) return nullptr;
  return m.strings.emplace_back(v.get<std::string>()).c_str();
}

// Rebuilds the table the child read and validates it again: the report crossed a process
// boundary from code that ran the package, so it is input like any other.
std::shared_ptr<const CheckedModule> rebuild_table(const nlohmann::json& j, const std::string& file,
                                                   std::string& problem) {
  auto m = std::make_shared<CheckedModule>();
  const uint16_t minor = j.at("abi_minor").get<uint16_t>();
  const auto& layers = j.at("layers");
  const auto& ops = j.at("ops");
  if (!layers.is_array() || !ops.is_array() || layers.size() > 4096 || ops.size() > 4096) {
    problem = "the layer or op list is malformed";
    return nullptr;
  }
  for (const auto& l : layers)
    m->layers.push_back({{sizeof(kh_layer_v1_t), KH_ABI_MAJOR, minor},
                         keep(*m, l.at("name")),
                         keep(*m, l.at("forward")),
                         keep(*m, l.at("forward_train")),
                         keep(*m, l.at("backward")),
                         l.at("flags").get<uint32_t>(),
                         l.at("dtypes").get<uint32_t>()});
  for (const auto& op : ops)
    m->ops.push_back({{sizeof(kh_op_v1_t), KH_ABI_MAJOR, minor},
                      keep(*m, op.at("name")),
                      keep(*m, op.at("schema")),
                      op.at("flags").get<uint32_t>(),
                      not_loaded_here});
  m->table = {{sizeof(kh_module_v1_t), KH_ABI_MAJOR, minor},
              keep(*m, j.at("name")),
              keep(*m, j.at("version")),
              keep(*m, j.at("build_id")),
              static_cast<uint32_t>(m->layers.size()),
              m->layers.data(),
              static_cast<uint32_t>(m->ops.size()),
              m->ops.data(),
              nullptr};
  std::vector<Check> checks;
  read_module_table(&m->table, file, checks, m->view);
  for (const auto& c : checks)
    if (!c.passed) {
      problem = c.message;
      return nullptr;
    }
  return m;
}

// Adds the child's checks (those the parent's preflight did not already report) and its table.
void take_report(const std::string& data, PackageCheck& out) {
  const std::string file = out.report.file;
  std::string problem;
  try {
    auto j = nlohmann::json::parse(data);
    std::vector<Check> checks;
    for (const auto& c : j.at("checks"))
      checks.push_back({c.at("name").get<std::string>(), c.at("passed").get<bool>(),
                        c.at("message").get<std::string>(), c.at("warning").get<bool>()});
    for (auto& c : checks) {
      bool seen = false;
      for (const auto& have : out.report.checks)
        seen =
            seen || (have.name == c.name && have.passed == c.passed && have.message == c.message);
      if (!seen) out.report.checks.push_back(std::move(c));
    }
    out.report.file = j.at("file").get<std::string>();
    if (j.contains("module")) out.module = rebuild_table(j.at("module"), file, problem);
  } catch (const nlohmann::json::exception& e) {
    problem = fmt::format("its report is unreadable ({})", e.what());
  }
  if (!problem.empty()) {
    out.module = nullptr;
    out.report.checks.push_back(
        {kIsolatedLoad, false,
         fmt::format("{}: refused by rule {}: the checker process's report does not hold up: {}",
                     file, kIsolatedLoad, problem)});
  }
}

}  // namespace

PackageCheck check_package(const std::filesystem::path& target, std::chrono::milliseconds timeout) {
  PackageCheck out{target.string(), {target.string(), {}}, nullptr};
  std::filesystem::path library = target;
  std::optional<PackageDir> dir;
  if (std::filesystem::is_directory(target)) {
    try {
      dir = read_package_dir(target);
      library = dir->host_library;
      out.report.checks.push_back({"kernel.json", true,
                                   fmt::format("{} {}, host library {}", dir->name, dir->version,
                                               library.filename().string())});
    } catch (const Error& e) {
      out.report.checks.push_back(
          {"kernel.json", false,
           fmt::format("{}: refused by rule kernel.json: {}", target.string(), e.what())});
      return out;
    }
  }
  // In this process: parsing only. The canonical path makes these messages the child's too.
  std::error_code ec;
  std::filesystem::path canonical = std::filesystem::canonical(library, ec);
  if (ec) {
    out.report.file = library.string();
    out.report.checks.push_back(
        {"readable", false,
         fmt::format("{}: refused by rule readable: cannot resolve the path: {}; check that the "
                     "package is unpacked and the file exists",
                     library.string(), ec.message())});
    return out;
  }
  out.report.file = canonical.string();
  PreflightReport preflight = preflight_file(canonical);
  for (auto& c : preflight.checks) out.report.checks.push_back(std::move(c));
  if (!out.report.ok()) return out;

  // The library's code runs only in the child.
  ChildOutcome child = run_in_child(canonical, timeout);
  if (!child.failure.empty()) {
    out.report.checks.push_back(
        {kIsolatedLoad, false,
         fmt::format("{}: refused by rule {}: {}", out.report.file, kIsolatedLoad, child.failure)});
    return out;
  }
  take_report(child.report, out);
  if (!out.module) return out;
  const ModuleView& v = out.module->view;
  if (dir) {
    bool same = v.name == dir->name && v.version == dir->version;
    out.report.checks.push_back(
        {"package-identity", same,
         same ? fmt::format("kernel.json and the module agree: {} {}", v.name, v.version)
              : fmt::format("{}: refused by rule package-identity: kernel.json says {} {} but "
                            "the host library says {} {}; repack the package",
                            library.string(), dir->name, dir->version, v.name, v.version)});
  }
  return out;
}

nlohmann::json PackageCheck::to_json() const {
  nlohmann::json j;
  j["target"] = target;
  j["file"] = report.file;
  j["ok"] = ok();
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : report.checks)
    checks.push_back(
        {{"name", c.name}, {"passed", c.passed}, {"warning", c.warning}, {"message", c.message}});
  j["checks"] = checks;
  if (module) {
    const ModuleView& v = module->view;
    nlohmann::json layers = nlohmann::json::array(), ops = nlohmann::json::array();
    for (auto* l : v.layers)
      layers.push_back({{"name", l->name},
                        {"forward", l->forward},
                        {"forward_train", l->forward_train ? l->forward_train : l->forward},
                        {"backward", l->backward ? nlohmann::json(l->backward) : nullptr},
                        {"flags", flag_list(l->flags)},
                        {"dtypes", dtype_list(l->dtypes)}});
    for (auto* op : v.ops)
      ops.push_back({{"name", op->name}, {"schema", op->schema}, {"flags", flag_list(op->flags)}});
    j["module"] = {
        {"name", v.name},         {"version", v.version},
        {"build_id", v.build_id}, {"abi", fmt::format("{}.{}", KH_ABI_MAJOR, v.abi_minor)},
        {"layers", layers},       {"ops", ops}};
  }
  return j;
}

std::string PackageCheck::failures() const {
  std::string out;
  for (auto& c : report.checks)
    if (!c.passed) out += "\n  " + c.message;
  return out;
}

std::string PackageCheck::to_text() const {
  std::string s;
  for (const auto& c : report.checks)
    s += fmt::format("{:<5} {:<17} {}\n", c.passed ? (c.warning ? "warn" : "ok") : "FAIL", c.name,
                     c.message);
  if (module) {
    const ModuleView& v = module->view;
    s += fmt::format("\npackage {} {} (build {}, ABI {}.{})\n", v.name, v.version,
                     v.build_id.empty() ? "-" : v.build_id, KH_ABI_MAJOR, v.abi_minor);
    s += "layers:\n";
    for (auto* l : v.layers)
      s += fmt::format("  {:<16} forward={} forward_train={} backward={} flags={} dtypes={}\n",
                       l->name, l->forward,
                       or_dash(l->forward_train ? l->forward_train : l->forward),
                       or_dash(l->backward), flag_names(l->flags), dtype_names(l->dtypes));
    s += "ops:\n";
    for (auto* op : v.ops)
      s += fmt::format("  {:<24} {}  flags={}\n", op->name, op->schema, flag_names(op->flags));
  }
  s += ok() ? "check passed\n" : "check FAILED\n";
  return s;
}

}  // namespace kh
