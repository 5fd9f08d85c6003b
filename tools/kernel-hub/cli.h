// Shared state of the kernel-hub CLI: global options, the store and the hub they select,
// and output helpers (human text or --json).
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "hub/hub.h"
#include "hub/store/store.h"

namespace kh::cli {

struct GlobalOptions {
  std::string hub;              // --hub, else KERNEL_HUB_ENDPOINT, else the embedded default hub
  std::string cache;            // --cache, else KERNEL_HUB_CACHE, else XDG cache
  bool offline = false;         // --offline or KERNEL_HUB_OFFLINE=1
  bool plain_http = false;      // --plain-http or KERNEL_HUB_PLAIN_HTTP=1
  bool allow_unsigned = false;  // --allow-unsigned or KERNEL_HUB_ALLOW_UNSIGNED=1
  bool json = false;
  bool quiet = false;
  bool verbose = false;
};

class Context {
 public:
  explicit Context(GlobalOptions options) : options_(std::move(options)) {}
  const GlobalOptions& options() const { return options_; }
  Store& store();
  Hub& hub();
  HubOptions hub_options() const;

  // Human output goes to stdout unless --json; diagnostics to stderr unless -q.
  void say(const std::string& line) const;
  void note(const std::string& line) const;
  // "warning: MESSAGE" on stderr, even under -q and --json: a warning says that something was
  // left out or will be refused (an unserved layer, an untrusted package), which no flag for
  // less chatter may hide.
  void warn(const std::string& message) const;
  // A line from a library's note callback: its "warning: " lines go through warn().
  void note_or_warn(const std::string& line) const;
  void print_json(const nlohmann::json& j) const;

 private:
  GlobalOptions options_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Hub> hub_;
};

// Each command file registers its subcommands; the callback runs with the context.
using Runner = std::function<int(Context&)>;
void add_hub_commands(CLI::App& app, Runner& run);       // pull, push, info, versions
void add_cache_commands(CLI::App& app, Runner& run);     // ls, verify, gc
void add_check_command(CLI::App& app, Runner& run);      // check
void add_registry_commands(CLI::App& app, Runner& run);  // resolve, why, lock, pack
void add_demo_command(CLI::App& app, Runner& run);       // demo
void add_trust_commands(CLI::App& app, Runner& run);     // keygen, sign, trust
void add_mirror_commands(CLI::App& app, Runner& run);    // export, import
void add_manifest_command(CLI::App& app, Runner& run);   // manifest
void add_init_command(CLI::App& app, Runner& run);       // init

// The one way a failure is reported: "error: MESSAGE" on stderr and, with --json,
// {"error": {"kind", "message"}} on stdout. `kind` is an error_kind_name() ("invalid_input", ...).
void print_error(bool json, std::string_view kind, const std::string& message);

std::string human_bytes(uint64_t bytes);
std::string iso_time(int64_t unix_seconds);
// "10G", "512M", "1024" -> bytes; "30d", "12h", "10m", "45s" -> seconds. kInvalidInput naming
// `option` (e.g. "--max-size") for an empty value, a bad unit or a value that does not fit.
uint64_t parse_size(const std::string& text, std::string_view option);
int64_t parse_duration(const std::string& text, std::string_view option);

}  // namespace kh::cli
