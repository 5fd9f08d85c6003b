#include "tools/demo/file_util.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include "kernel_hub/kernel_hub.hpp"

namespace kh::demo {

std::string read_file(const std::filesystem::path& path, uint64_t max_bytes) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status))
    throw Error(ErrorKind::kNotFound, fmt::format("file not found: {}", path.string()));
  if (!std::filesystem::is_regular_file(status))
    throw Error(ErrorKind::kRefused,
                fmt::format("{} is not a regular file; give the path of a file", path.string()));
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec)
    throw Error(ErrorKind::kIo,
                fmt::format("cannot read the size of {}: {}", path.string(), ec.message()));
  if (size > max_bytes)
    throw Error(ErrorKind::kRefused, fmt::format("{} has {} bytes, more than the {} allowed",
                                                 path.string(), size, max_bytes));
  std::ifstream in(path, std::ios::binary);
  std::string bytes(static_cast<size_t>(size), '\0');
  if (!in || !in.read(bytes.data(), static_cast<std::streamsize>(size)))
    throw Error(ErrorKind::kIo,
                fmt::format("cannot read {}: {}", path.string(), std::strerror(errno)));
  return bytes;
}

}  // namespace kh::demo
