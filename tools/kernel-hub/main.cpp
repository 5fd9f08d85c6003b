// kernel-hub: the command-line front end. Each command lives in its own file; this one parses
// global options, builds the context and maps errors to exit codes (0 ok, 1 failure,
// 2 bad usage or input).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>

#include "hub/base/env.h"
#include "hub/base/error.h"
#include "hub/base/log.h"
#include "kernel_hub/kernel_hub.h"
#include "tools/kernel-hub/cli.h"

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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  g.offline = g.offline || kh::env_flag("KERNEL_HUB_OFFLINE");
  g.plain_http = g.plain_http || kh::env_flag("KERNEL_HUB_PLAIN_HTTP");
  // -v: every log line, info included (such as a pull waiting for another process's download).
  if (g.verbose) {
    kh::set_log_sink([](int, const std::string& line) {
      std::cerr << "kernel-hub: " << kh::terminal_safe(line) << "\n";
    });
  }

  try {
    Context ctx(g);
    return run(ctx);
  } catch (const kh::Error& e) {
    std::cerr << "error: " << kh::terminal_safe(e.what()) << "\n";
    if (g.json) {
      std::cout << nlohmann::json{{"error",
                                   {{"kind", kh::error_kind_name(e.kind())},
                                    {"message", e.what()}}}}
                       .dump(2)
                << "\n";
    }
    return e.kind() == kh::ErrorKind::kInvalidInput ? 2 : 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << kh::terminal_safe(e.what()) << "\n";
    return 1;
  }
}
