#include "loader/module_table.h"

#include <cstring>
#include <set>

#include <fmt/format.h>

namespace kh {

namespace {

constexpr uint32_t kMaxEntries = 4096;
constexpr size_t kMaxName = 256;
constexpr size_t kMaxSchema = 4096;
constexpr uint32_t kLayerFlags = KH_FLAG_HAS_BACKWARD | KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC;

// Collects problems; the table is refused when any was found.
struct Problems {
  std::vector<std::string> list;
  void add(std::string p) { list.push_back(std::move(p)); }
};

bool valid_text(const char* s, size_t max) {
  if (!s) return false;
  size_t n = strnlen(s, max);
  if (n == 0 || n == max) return false;
  for (size_t i = 0; i < n; ++i)
    if (static_cast<unsigned char>(s[i]) < 0x20) return false;
  return true;
}

// Walks an array whose elements begin with kh_header_t, by the first element's struct_size.
template <typename T>
bool walk_array(const T* base, uint32_t count, const char* what, Problems& p,
                std::vector<const T*>& out) {
  if (count == 0) return true;
  if (count > kMaxEntries) {
    p.add(fmt::format("{} count {} exceeds {}", what, count, kMaxEntries));
    return false;
  }
  if (!base) {
    p.add(fmt::format("{} count is {} but the array pointer is NULL", what, count));
    return false;
  }
  kh_header_t first;
  std::memcpy(&first, base, sizeof first);
  if (first.abi_major != KH_ABI_MAJOR || first.struct_size < sizeof(T)) {
    p.add(fmt::format("{}[0] has ABI {}.{} and struct_size {}; expected major {} and at least {}",
                      what, first.abi_major, first.abi_minor, first.struct_size, KH_ABI_MAJOR,
                      sizeof(T)));
    return false;
  }
  const char* bytes = reinterpret_cast<const char*>(base);
  for (uint32_t i = 0; i < count; ++i) {
    const T* e = reinterpret_cast<const T*>(bytes + size_t{i} * first.struct_size);
    if (e->h.struct_size != first.struct_size || e->h.abi_major != KH_ABI_MAJOR) {
      p.add(
          fmt::format("{}[{}] has struct_size {} (ABI major {}); every element must match "
                      "{}[0] (struct_size {})",
                      what, i, e->h.struct_size, e->h.abi_major, what, first.struct_size));
      return false;
    }
    out.push_back(e);
  }
  return true;
}

void check_ops(const std::vector<const kh_op_v1_t*>& ops, Problems& p) {
  std::set<std::string_view> seen;
  for (size_t i = 0; i < ops.size(); ++i) {
    const kh_op_v1_t* op = ops[i];
    if (!valid_text(op->name, kMaxName)) {
      p.add(fmt::format("op {} has a missing, empty or overlong name", i));
      continue;
    }
    if (!seen.insert(op->name).second) p.add(fmt::format("op name {} appears twice", op->name));
    if (!valid_text(op->schema, kMaxSchema))
      p.add(fmt::format("op {} has a missing or empty schema", op->name));
    if (!op->call) p.add(fmt::format("op {} has a NULL call function", op->name));
    if (op->flags & ~KH_FLAGS_KNOWN)
      p.add(
          fmt::format("op {} has unknown flag bits {:#x}", op->name, op->flags & ~KH_FLAGS_KNOWN));
  }
}

void check_layers(const ModuleView& view, Problems& p) {
  std::set<std::string_view> seen;
  for (size_t i = 0; i < view.layers.size(); ++i) {
    const kh_layer_v1_t* l = view.layers[i];
    if (!valid_text(l->name, kMaxName)) {
      p.add(fmt::format("layer {} has a missing, empty or overlong name", i));
      continue;
    }
    if (!seen.insert(l->name).second) p.add(fmt::format("layer name {} appears twice", l->name));
    auto refers = [&](const char* role, const char* op, bool required) {
      if (!op) {
        if (required) p.add(fmt::format("layer {} has no {} op", l->name, role));
        return;
      }
      if (!valid_text(op, kMaxName) || !view.find_op(op))
        p.add(fmt::format("layer {} names {} op \"{}\", which the package does not define", l->name,
                          role, valid_text(op, kMaxName) ? op : "(invalid)"));
    };
    bool has_backward = l->flags & KH_FLAG_HAS_BACKWARD;
    refers("forward", l->forward, true);
    refers("forward_train", l->forward_train, false);
    refers("backward", l->backward, has_backward);
    if (l->backward && !has_backward)
      p.add(fmt::format("layer {} names a backward op but lacks the HAS_BACKWARD flag", l->name));
    if (l->flags & ~kLayerFlags)
      p.add(fmt::format("layer {} has unknown flag bits {:#x}", l->name, l->flags & ~kLayerFlags));
    if (l->dtypes == 0 || (l->dtypes & ~KH_DTYPES_KNOWN))
      p.add(fmt::format("layer {} has dtypes {:#x}; expected a non-empty subset of bf16|fp16|fp32",
                        l->name, l->dtypes));
  }
}

}  // namespace

const kh_op_v1_t* ModuleView::find_op(std::string_view n) const {
  for (auto* op : ops)
    if (op->name && n == op->name) return op;
  return nullptr;
}

const kh_layer_v1_t* ModuleView::find_layer(std::string_view n) const {
  for (auto* l : layers)
    if (l->name && n == l->name) return l;
  return nullptr;
}

void read_module_table(const kh_module_v1_t* table, const std::string& file,
                       std::vector<Check>& checks, ModuleView& out) {
  // The header alone first: nothing past it is read until the major matches.
  kh_header_t header;
  std::memcpy(&header, table, sizeof header);
  if (header.abi_major != KH_ABI_MAJOR) {
    checks.push_back(
        {"abi-version", false,
         fmt::format("{}: refused by rule abi-version: the package uses kernel-hub ABI {}.{}, "
                     "this loader speaks major {}; use a package build for ABI {}.x or a "
                     "matching loader",
                     file, header.abi_major, header.abi_minor, KH_ABI_MAJOR, KH_ABI_MAJOR)});
    return;
  }
  if (header.struct_size < sizeof(kh_module_v1_t)) {
    checks.push_back(
        {"abi-version", false,
         fmt::format("{}: refused by rule abi-version: module table struct_size {} is smaller "
                     "than the {} bytes of ABI {}.0",
                     file, header.struct_size, sizeof(kh_module_v1_t), KH_ABI_MAJOR)});
    return;
  }
  checks.push_back({"abi-version", true,
                    fmt::format("ABI {}.{} (struct_size {}); loader speaks {}.{}", header.abi_major,
                                header.abi_minor, header.struct_size, KH_ABI_MAJOR, KH_ABI_MINOR)});

  ModuleView view;
  view.table = table;
  view.abi_minor = header.abi_minor;
  view.struct_size = header.struct_size;
  Problems p;
  if (!valid_text(table->name, kMaxName)) p.add("the package name is missing or invalid");
  if (!valid_text(table->version, kMaxName)) p.add("the package version is missing or invalid");
  if (!table->build_id) p.add("build_id is NULL (use \"\" when there is none)");
  if (p.list.empty()) {
    view.name = table->name;
    view.version = table->version;
    view.build_id = table->build_id;
  }
  if (walk_array(table->ops, table->num_ops, "ops", p, view.ops)) check_ops(view.ops, p);
  if (walk_array(table->layers, table->num_layers, "layers", p, view.layers)) check_layers(view, p);
  if (view.layers.empty() && p.list.empty()) p.add("the package declares no layers");

  if (!p.list.empty()) {
    std::string all;
    for (auto& s : p.list) all += (all.empty() ? "" : "; ") + s;
    checks.push_back(
        {"module-table", false, fmt::format("{}: refused by rule module-table: {}", file, all)});
    return;
  }
  checks.push_back({"module-table", true,
                    fmt::format("{} {}: {} layer(s), {} op(s)", view.name, view.version,
                                view.layers.size(), view.ops.size())});
  out = std::move(view);
}

std::string flag_names(uint32_t flags) {
  std::string s;
  auto add = [&](uint32_t bit, const char* name) {
    if (flags & bit) s += (s.empty() ? "" : "|") + std::string(name);
  };
  add(KH_FLAG_HAS_BACKWARD, "HAS_BACKWARD");
  add(KH_FLAG_GRAPH_SAFE, "GRAPH_SAFE");
  add(KH_FLAG_DETERMINISTIC, "DETERMINISTIC");
  add(KH_FLAG_INFERENCE_ONLY, "INFERENCE_ONLY");
  return s.empty() ? "-" : s;
}

std::string dtype_names(uint32_t dtypes) {
  std::string s;
  auto add = [&](uint32_t bit, const char* name) {
    if (dtypes & bit) s += (s.empty() ? "" : ",") + std::string(name);
  };
  add(KH_DTYPE_BF16, "bf16");
  add(KH_DTYPE_FP16, "fp16");
  add(KH_DTYPE_FP32, "fp32");
  return s.empty() ? "-" : s;
}

}  // namespace kh
