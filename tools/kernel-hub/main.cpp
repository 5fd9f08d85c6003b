// kernel-hub: the command-line front end. Each command lives in its own file; this one parses
// global options, builds the context and maps errors to exit codes (0 ok, 1 failure,
// 2 bad usage or input).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string_view>

#include "hub/base/env.h"
#include "hub/base/error.h"
#include "hub/base/log.h"
#include "kernel_hub/kernel_hub.h"
#include "tools/kernel-hub/cli.h"

namespace {

// Whether --json was given anywhere before "--". A parse error comes before CLI11 sets the flag,
// and the error object must still reach stdout.
bool argv_asks_json(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") return false;
    if (a == "--json") return true;
  }
  return false;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The message for a word that names no subcommand of `app`: the nearest name when it is close
// (a typo), and the list.
std::string unknown_command_message(const CLI::App& app, const std::string& word) {
  std::string names, nearest;
  size_t best = 3;  // suggest only within two edits
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    const std::string& name = sub->get_name();
    names += (names.empty() ? "" : ", ") + name;
    size_t d = edit_distance(word, name);
    if (d < best) best = d, nearest = name;
  }
  // "kernel-hub trust" for a nested command; nothing for the top level.
  std::string where =
      app.get_parent() ? fmt::format(" for '{} {}'", app.get_parent()->get_name(), app.get_name())
                       : "";
  return fmt::format("unknown command '{}'{}{}; commands: {}", word, where,
                     nearest.empty() ? "" : fmt::format(" (did you mean '{}'?)", nearest), names);
}

// CLI11 takes a stray word as an extra positional and says "A subcommand is required", which
// tells a user who typed a command (misspelled) to type one. Finds the first word that is
// neither an option nor an option's value, for `app` and then for the command it names where
// that one has commands of its own (trust), and returns the message when it names none.
std::optional<std::string> unknown_command(const CLI::App& app, int argc, char** argv, int i) {
  if (app.get_require_subcommand_min() == 0) return std::nullopt;
  for (; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") return std::nullopt;
    if (a.starts_with("-")) {
      // An option written apart from its value ("--hub URL") takes the next word; global
      // options may follow a command name (fallthrough), so the parents' count too.
      const CLI::Option* opt = nullptr;
      for (const CLI::App* p = &app; p && !opt; p = p->get_parent())
        opt = p->get_option_no_throw(std::string(a));
      if (opt && opt->get_expected_max() > 0 && a.find('=') == std::string_view::npos) ++i;
      continue;
    }
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      if (sub->check_name(std::string(a))) return unknown_command(*sub, argc, argv, i + 1);
    return unknown_command_message(app, std::string(a));
  }
  return std::nullopt;  // no command at all: CLI11's "A subcommand is required"
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kh::cli;
  CLI::App app{
      "kernel-hub: fetch, cache, verify and publish GPU kernel packages from OCI hubs.\n"
      "Environment: KERNEL_HUB_ENDPOINT (default hub), KERNEL_HUB_CACHE (cache dir),\n"
      "KERNEL_HUB_OFFLINE=1, KERNEL_HUB_PLAIN_HTTP=1, KERNEL_HUB_USERNAME/KERNEL_HUB_PASSWORD\n"
      "(sent only to KERNEL_HUB_CREDENTIALS_HOST, else to KERNEL_HUB_ENDPOINT's registry),\n"
      "KERNEL_HUB_COMMAND_TIMEOUT_S, KERNEL_HUB_UNPACK_BUDGET,\n"
      "KERNEL_HUB_CREDENTIALS (credentials file; then REGISTRY_AUTH_FILE / containers\n"
      "auth.json and DOCKER_CONFIG / ~/.docker/config.json with credential helpers),\n"
      "KERNEL_HUB_CA_BUNDLE (else SSL_CERT_FILE, CURL_CA_BUNDLE; SSL_CERT_DIR),\n"
      "KERNEL_HUB_CERTS_D (certs.d/HOST[:PORT] CAs and client certificates), KERNEL_HUB_REF_TTL\n"
      "(seconds a tag record is trusted, default 600), KERNEL_HUB_LOCAL (org/name=/dir,...),\n"
      "KERNEL_HUB_DISABLE=1 (every layer keeps its fallback), KERNEL_HUB_NVRTC (NVRTC library),\n"
      "KERNEL_HUB_TRUST_DIR (trusted keys), KERNEL_HUB_ALLOW_UNSIGNED=1, KERNEL_HUB_OFFLINE_GRACE\n"
      "(seconds past expiry offline loads still accept, default 604800), KERNEL_HUB_DATA_DIR\n"
      "(the embedded default hub and its key; default: ../share/kernel-hub from the binary),\n"
      "KERNEL_HUB_MIRRORS ([REGISTRY=]MIRROR,...: pull-through mirrors tried before the hub).",
      "kernel-hub"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the command name too
  GlobalOptions g;
  app.add_option("--hub", g.hub,
                 "Hub address: oci://HOST[:PORT][/NS], http(s)://URL or file://DIR "
                 "(default: $KERNEL_HUB_ENDPOINT, else the embedded default hub)");
  app.add_option("--cache", g.cache,
                 "Cache directory (default: $KERNEL_HUB_CACHE, else "
                 "$XDG_CACHE_HOME/kernel-hub or ~/.cache/kernel-hub)");
  app.add_flag("--offline", g.offline, "No network access; resolve from the cache only");
  app.add_flag("--plain-http", g.plain_http, "Talk plain HTTP to oci:// registries");
  app.add_flag("--allow-unsigned", g.allow_unsigned,
               "Load packages without a valid trusted signature (development only; warns on "
               "every load)");
  app.add_flag("--json", g.json, "Machine-readable output on stdout");
  app.add_flag("-q,--quiet", g.quiet, "No progress bar or notes");
  app.add_flag("-v,--verbose", g.verbose, "More detail on stderr");
  // The version of the code linked into this binary (kernel_hub.h "Versions").
  app.set_version_flag("--version", "kernel-hub " KH_VERSION_STRING);

  Runner run;
  add_hub_commands(app, run);
  add_cache_commands(app, run);
  add_check_command(app, run);
  add_registry_commands(app, run);
  add_demo_command(app, run);
  add_trust_commands(app, run);
  add_mirror_commands(app, run);
  add_manifest_command(app, run);
  add_init_command(app, run);

  const bool json_in_argv = argv_asks_json(argc, argv);
  if (auto message = unknown_command(app, argc, argv, 1)) {
    print_error(json_in_argv, kh::error_kind_name(kh::ErrorKind::kInvalidInput), *message);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    print_error(json_in_argv, kh::error_kind_name(kh::ErrorKind::kInvalidInput), e.what());
    std::cerr << "Run with --help for more information.\n";
    return 2;
  }
  // -v: every log line, info included (such as a pull waiting for another process's download).
  if (g.verbose) {
    kh::set_log_sink([](int, const std::string& line) {
      std::cerr << "kernel-hub: " << kh::terminal_safe(line) << "\n";
    });
  }

  try {
    // Inside the try: a bad value (KERNEL_HUB_OFFLINE=maybe) is an error naming the variable.
    g.offline = g.offline || kh::env_flag("KERNEL_HUB_OFFLINE");
    g.plain_http = g.plain_http || kh::env_flag("KERNEL_HUB_PLAIN_HTTP");
    Context ctx(g);
    return run(ctx);
  } catch (const kh::Error& e) {
    print_error(g.json, kh::error_kind_name(e.kind()), e.what());
    return e.kind() == kh::ErrorKind::kInvalidInput ? 2 : 1;
  } catch (const std::exception& e) {
    print_error(g.json, "internal", e.what());
    return 1;
  }
}
