// A reader of the safetensors format (what Transformers checkpoints are stored in): an 8-byte
// little-endian header length N, N bytes of JSON header, then the data. The header maps each
// tensor's name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data that
// follows the header), plus an optional "__metadata__" map of strings.
//
// The file is untrusted input, so everything is checked before any tensor is touched: the header
// length against the file and a limit, the JSON's structure, every dtype known, every shape's
// element count times the dtype's size equal to its byte span (without overflow), every span
// inside the data, and no two spans overlapping. Violations throw kh::Error (kInvalidInput) naming
// the file and, where there is one, the tensor. tests/fuzz/fuzz_safetensors.cpp fuzzes parse().
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kh::demo {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // as written: "F32", "BF16", "F16", "I64", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte span in the data section
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // The largest header accepted (the format's own reference implementation uses 100 MB).
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

  // Parses and checks `bytes` (the whole file); `source` names it in errors.
  static SafetensorsFile parse(std::string bytes, std::string source);
  // Reads and parses a file; a missing file throws kNotFound naming it.
  static SafetensorsFile read(const std::filesystem::path& path);

  const std::string& source() const { return source_; }
  // In the header's order (by name: JSON objects are sorted).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor's elements as fp32: F32 as is, BF16 and F16 widened exactly (also F64, rounded).
  // Other dtypes throw kUnsupported naming the tensor and its dtype.
  std::vector<float> to_f32(const SafetensorsTensor& tensor) const;

 private:
  std::string source_;
  std::string bytes_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The size in bytes of one element of a safetensors dtype, 0 when the dtype is unknown.
size_t safetensors_dtype_size(std::string_view dtype);

// Encodes fp32 tensors (name -> shape, values) as a safetensors file: for tests and the fuzz
// target's round trip. Throws kInvalidInput when a shape does not match its values.
struct F32Tensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};
std::string encode_safetensors(const std::map<std::string, F32Tensor>& tensors);

}  // namespace kh::demo
