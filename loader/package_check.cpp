#include "loader/package_check.h"

#include <fmt/format.h>

#include "hub/base/error.h"
#include "loader/package_dir.h"

namespace kh {

namespace {

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

}  // namespace

PackageCheck check_package(const std::filesystem::path& target) {
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
  LoadResult r = try_load_module(library);
  for (auto& c : r.report.checks) out.report.checks.push_back(std::move(c));
  out.report.file = r.report.file;
  if (!r.module) return out;
  const ModuleView& v = r.module->view;
  if (dir) {
    bool same = v.name == dir->name && v.version == dir->version;
    out.report.checks.push_back(
        {"package-identity", same,
         same ? fmt::format("kernel.json and the module agree: {} {}", v.name, v.version)
              : fmt::format("{}: refused by rule package-identity: kernel.json says {} {} but "
                            "the host library says {} {}; repack the package",
                            library.string(), dir->name, dir->version, v.name, v.version)});
  }
  out.module = r.module;
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
