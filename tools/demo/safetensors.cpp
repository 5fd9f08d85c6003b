#include "tools/demo/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/file_util.h"

namespace kh::demo {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; the reader copies it as is");

namespace {

[[noreturn]] void bad(const std::string& source, const std::string& why) {
  throw Error(ErrorKind::kInvalidInput,
              fmt::format("{}: not a valid safetensors file: {}", source, why));
}

// IEEE half to float, exactly (subnormals, infinities and NaN included).
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: mant * 2^-24, exact in fp32
    const float v = static_cast<float>(mant) * 0x1.0p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(bits);
}

}  // namespace

size_t safetensors_dtype_size(std::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;  // bounded at parse time
  return n;
}

SafetensorsFile SafetensorsFile::parse(std::string bytes, std::string source) {
  SafetensorsFile f;
  f.source_ = std::move(source);
  f.bytes_ = std::move(bytes);
  const std::string& src = f.source_;
  const uint64_t size = f.bytes_.size();
  if (size < 8) bad(src, fmt::format("{} bytes; the 8-byte header length is missing", size));
  uint64_t header_len;
  std::memcpy(&header_len, f.bytes_.data(), 8);
  if (header_len > kMaxHeaderBytes)
    bad(src,
        fmt::format("header length {} exceeds the {} byte limit", header_len, kMaxHeaderBytes));
  if (header_len > size - 8)
    bad(src,
        fmt::format("header length {} runs past the end of the {} byte file", header_len, size));
  f.data_start_ = 8 + header_len;
  const uint64_t data_size = size - f.data_start_;

  const nlohmann::json header = nlohmann::json::parse(
      std::string_view(f.bytes_).substr(8, header_len), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) bad(src, "the header is not JSON");
  if (!header.is_object()) bad(src, "the header is not a JSON object");

  for (const auto& item : header.items()) {
    const std::string& name = item.key();  // not a structured binding: lambdas capture it
    const nlohmann::json& entry = item.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) bad(src, "__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) bad(src, fmt::format("__metadata__ value of '{}' is not a string", k));
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    auto bad_tensor = [&](const std::string& why) {
      bad(src, fmt::format("tensor '{}': {}", name, why));
    };
    if (!entry.is_object()) bad_tensor("its entry is not an object");
    SafetensorsTensor t;
    t.name = name;
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) bad_tensor("no dtype string");
    t.dtype = entry["dtype"].get<std::string>();
    const size_t elem = safetensors_dtype_size(t.dtype);
    if (elem == 0) bad_tensor(fmt::format("unknown dtype '{}'", t.dtype));
    if (!entry.contains("shape") || !entry["shape"].is_array()) bad_tensor("no shape array");
    if (entry["shape"].size() > 8) bad_tensor("more than 8 dimensions");
    // The element count stays below the file size (else the span check below fails), so
    // bounding each step by 2^62 keeps the product from overflowing.
    uint64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) bad_tensor("a dimension is not a non-negative integer");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > (1ull << 62) || (dim != 0 && numel > (1ull << 62) / dim))
        bad_tensor("its element count overflows");
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = entry.contains("data_offsets") ? entry["data_offsets"] : nlohmann::json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      bad_tensor("data_offsets is not [begin, end]");
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_size)
      bad_tensor(fmt::format("data_offsets [{}, {}] outside the {} bytes of data", t.begin, t.end,
                             data_size));
    if (numel > (1ull << 62) / elem || numel * elem != t.end - t.begin)
      bad_tensor(fmt::format("shape holds {} elements of {} bytes; data_offsets span {} bytes",
                             numel, elem, t.end - t.begin));
    f.tensors_.push_back(std::move(t));
  }

  std::vector<const SafetensorsTensor*> by_offset;
  for (const auto& t : f.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      bad(src,
          fmt::format("tensors '{}' and '{}' overlap", by_offset[i - 1]->name, by_offset[i]->name));
  return f;
}

SafetensorsFile SafetensorsFile::read(const std::filesystem::path& path) {
  return parse(read_file(path), path.string());
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<float> SafetensorsFile::to_f32(const SafetensorsTensor& t) const {
  const char* p = bytes_.data() + data_start_ + t.begin;
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  if (t.dtype == "F32") {
    std::memcpy(out.data(), p, n * 4);
  } else if (t.dtype == "BF16") {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
    }
  } else if (t.dtype == "F16") {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = half_to_float(h);
    }
  } else if (t.dtype == "F64") {
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{}: tensor '{}' is {}; expected F32, BF16 or F16 weights", source_,
                            t.name, t.dtype));
  }
  return out;
}

std::string encode_safetensors(const std::map<std::string, F32Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    int64_t n = 1;
    for (int64_t s : t.shape) n *= s;
    if (n != static_cast<int64_t>(t.values.size()))
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("encode_safetensors: tensor '{}' has {} values for {} elements", name,
                              t.values.size(), n));
    const size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * 4);
    header[name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string text = header.dump();
  const uint64_t len = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &len, 8);
  return out + text + data;
}

}  // namespace kh::demo
