// Reads and validates the table a package's kh_module_v1 returned: the ABI header first (another
// major is rejected before any other field is read), then names, ops, layers and flags.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kernel_hub/kernel_hub_abi.h"
#include "loader/elf_preflight.h"

namespace kh {

// A validated view of a module table. Pointers refer to the package's static data, which lives
// for the rest of the process (libraries are never unloaded).
struct ModuleView {
  const kh_module_v1_t* table = nullptr;
  uint16_t abi_minor = 0;
  uint32_t struct_size = 0;
  std::string name, version, build_id;
  std::vector<const kh_layer_v1_t*> layers;
  std::vector<const kh_op_v1_t*> ops;

  const kh_op_v1_t* find_op(std::string_view name) const;
  const kh_layer_v1_t* find_layer(std::string_view name) const;
};

// Appends the checks "abi-version" and (when the ABI fits) "module-table" to `checks`; fills
// `out` when both pass. `file` names the library in messages.
void read_module_table(const kh_module_v1_t* table, const std::string& file,
                       std::vector<Check>& checks, ModuleView& out);

// "HAS_BACKWARD|GRAPH_SAFE", "bf16,fp32": for check output and logs.
std::string flag_names(uint32_t flags);
std::string dtype_names(uint32_t dtypes);

}  // namespace kh
