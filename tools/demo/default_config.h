// The KernelConfig `kernel-hub demo` uses without --config: manifests/examples/demo-config.json,
// embedded at build time so that the binary works away from the source tree.
#pragma once

#include <string_view>

namespace kh::demo {

std::string_view default_demo_config_json();

}  // namespace kh::demo
