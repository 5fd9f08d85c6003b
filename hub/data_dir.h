// Where kernel-hub's read-only data is: the embedded default hub (default-hub/, a signed layout
// hub) and its public key (default-hub-key/signing.pub). No path is compiled in, so that an
// installed prefix can be moved and still works:
//   1. $KERNEL_HUB_DATA_DIR, when set;
//   2. the install this code runs from: <prefix>/share/kernel-hub, found from the file that holds
//      this code (the kernel-hub binary in <prefix>/bin, or libkernel_hub.so in <prefix>/lib);
//   3. the build tree this code runs from: the build directory, recognized by the marker file
//      the configure step writes there (kBuildTreeMarker), at most a few folders up.
// A binary that is none of these (copied away from its prefix or build) has no data directory
// and says so; it never falls back to an empty hub.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace kh {

// The file that marks a build tree (written by the top-level CMakeLists.txt; never installed).
inline constexpr const char* kBuildTreeMarker = "kernel-hub-build-tree";

struct DataDirLookup {
  std::optional<std::filesystem::path> dir;  // the data directory, when one was found
  std::string looked;  // where the lookup looked, for messages ("KERNEL_HUB_DATA_DIR=..., ...")
};

// Finds the data directory (a few stat calls; nothing is cached, so the environment is read
// each time).
DataDirLookup find_data_dir();

// The data directory, or kh::Error (kNotFound) saying where it looked and what to do.
std::filesystem::path data_dir();

}  // namespace kh
