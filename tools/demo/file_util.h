// The runtime's one file utility: a whole file read into memory (config.json, a checkpoint's
// index and safetensors files). The runtime builds against the installed SDK only, so it has its
// own instead of the hub's (hub/base/fs.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace kh::demo {

// The file's bytes. Throws kh::Error: kNotFound when there is no such file, kRefused when it is
// larger than max_bytes or not a regular file, kIo when reading fails.
std::string read_file(const std::filesystem::path& path, uint64_t max_bytes = UINT64_MAX);

}  // namespace kh::demo
