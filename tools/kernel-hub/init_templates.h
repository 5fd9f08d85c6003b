// The files of `kernel-hub init`'s scaffold (tools/kernel-hub/init_templates/), embedded into the
// CLI at build time by embed_templates.cmake so that an installed kernel-hub needs no data files.
#pragma once

#include <string_view>
#include <vector>

namespace kh::cli {

struct InitTemplate {
  std::string_view name;  // file name in init_templates/ ("NAME.cu", "dot.gitignore", ...)
  std::string_view text;  // with @KH_PACKAGE@ (org/name) and @KH_NAME@ (name) placeholders
};

// Every template, sorted by name.
const std::vector<InitTemplate>& init_templates();

}  // namespace kh::cli
