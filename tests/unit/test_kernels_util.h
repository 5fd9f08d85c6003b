// Helpers for the kernel package tests: host tensors of bf16/fp16/fp32 viewed as DLPack rows
// (with row strides and poisoned gaps), float64 references, relative L2 errors, seeded RNGs, and
// loading a package's host library through the real loader to call its ops.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/kh_prelude.cuh"
#include "loader/host_services.h"
#include "loader/module.h"

namespace kh::kernels_test {

enum DType { kBF16 = 0, kFP16 = 1, kFP32 = 2 };
inline const char* dtype_name(int d) {
  return d == kBF16 ? "bf16" : d == kFP16 ? "fp16" : "fp32";
}
inline int dtype_bytes(int d) {
  return d == kFP32 ? 4 : 2;
}
inline DLDataType dl_dtype(int d) {
  return d == kBF16   ? DLDataType{kDLBfloat, 16, 1}
         : d == kFP16 ? DLDataType{kDLFloat, 16, 1}
                      : DLDataType{kDLFloat, 32, 1};
}
// Relative L2 tolerance by storage dtype.
inline double tolerance(int d) {
  return d == kBF16 ? 1e-2 : d == kFP16 ? 2e-3 : 1e-5;
}

// Bits a poisoned element holds (a NaN no kernel produces: a signalling-looking payload).
inline uint32_t poison_bits(int d) {
  return d == kBF16 ? 0x7FA5u : d == kFP16 ? 0x7D5Au : 0x7FA5A5A5u;
}

// A seed from std::random_device, printed by every failing test (SCOPED_TRACE).
inline uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

// A host tensor of `rows` rows of `cols` elements, `stride` elements apart (stride >= cols),
// 16-byte aligned storage plus `offset_elems` (to make a misaligned view). As DLPack it is
// [rows, cols] with strides {stride, 1}, or 1-D [cols] when `vector` is set.
class HostTensor {
 public:
  HostTensor(int dtype, int64_t rows, int64_t cols, int64_t stride = -1, int64_t offset_elems = 0,
             bool vector = false)
      : dtype_(dtype),
        rows_(rows),
        cols_(cols),
        stride_(stride < 0 ? cols : stride),
        offset_(offset_elems),
        vector_(vector) {
    const int64_t elems = offset_ + (rows_ > 0 ? (rows_ - 1) * stride_ + cols_ : 0) + 16;
    storage_.assign(static_cast<size_t>(elems * dtype_bytes(dtype_) + 16), 0);
    fill_bits(poison_bits(dtype_));
  }

  int dtype() const { return dtype_; }
  // Bytes from data() to the end of the last row (plus a 16-element tail): what a device mirror
  // of this tensor holds.
  size_t span_bytes() const {
    return static_cast<size_t>(((rows_ > 0 ? (rows_ - 1) * stride_ + cols_ : 0) + 16) *
                               dtype_bytes(dtype_));
  }
  int64_t offset_elems() const { return offset_; }
  bool is_vector() const { return vector_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t stride() const { return stride_; }

  char* base() {
    uintptr_t p = reinterpret_cast<uintptr_t>(storage_.data());
    return reinterpret_cast<char*>((p + 15) & ~uintptr_t{15});
  }
  char* data() { return base() + offset_ * dtype_bytes(dtype_); }

  uint32_t bits_at(int64_t i) {  // element i of the whole buffer (from data())
    char* p = data() + i * dtype_bytes(dtype_);
    if (dtype_ == kFP32) {
      uint32_t u;
      std::memcpy(&u, p, 4);
      return u;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
  }
  void set_bits(int64_t i, uint32_t bits) {
    char* p = data() + i * dtype_bytes(dtype_);
    if (dtype_ == kFP32) {
      std::memcpy(p, &bits, 4);
    } else {
      uint16_t h = static_cast<uint16_t>(bits);
      std::memcpy(p, &h, 2);
    }
  }
  // Every element of the buffer, gaps between rows included.
  void fill_bits(uint32_t bits) {
    const int64_t n = (static_cast<int64_t>(storage_.size()) - 16) / dtype_bytes(dtype_) - offset_;
    for (int64_t i = 0; i < n; ++i) set_bits(i, bits);
  }
  void poison() { fill_bits(poison_bits(dtype_)); }

  static double to_double(int dtype, uint32_t bits) {
    if (dtype == kBF16) return kh_bf16_bits_to_float(static_cast<uint16_t>(bits));
    if (dtype == kFP16) return kh_fp16_bits_to_float(static_cast<uint16_t>(bits));
    return kh_bits_float(bits);
  }
  static uint32_t from_double(int dtype, double v) {
    float f = static_cast<float>(v);
    if (dtype == kBF16) return kh_float_to_bf16_bits(f);
    if (dtype == kFP16) return kh_float_to_fp16_bits(f);
    return kh_float_bits(f);
  }
  double get(int64_t r, int64_t c) { return to_double(dtype_, bits_at(r * stride_ + c)); }
  // Stores v rounded to the dtype and returns the stored value.
  double set(int64_t r, int64_t c, double v) {
    set_bits(r * stride_ + c, from_double(dtype_, v));
    return get(r, c);
  }
  template <typename F>
  void fill(F&& f) {
    for (int64_t r = 0; r < rows_; ++r)
      for (int64_t c = 0; c < cols_; ++c) set(r, c, f(r, c));
  }
  std::vector<double> values() {
    std::vector<double> v(static_cast<size_t>(rows_ * cols_));
    for (int64_t r = 0; r < rows_; ++r)
      for (int64_t c = 0; c < cols_; ++c) v[r * cols_ + c] = get(r, c);
    return v;
  }
  // Elements between rows (stride > cols) still hold the poison: the op wrote only its rows.
  bool gaps_untouched() {
    for (int64_t r = 0; r + 1 < rows_; ++r)
      for (int64_t c = cols_; c < stride_; ++c)
        if (bits_at(r * stride_ + c) != poison_bits(dtype_)) return false;
    return true;
  }

  const DLTensor* dl() {
    shape_[0] = rows_;
    shape_[1] = cols_;
    strides_[0] = stride_;
    strides_[1] = 1;
    t_ = DLTensor{};
    t_.data = data();
    t_.device = device_;
    t_.dtype = dl_dtype(dtype_);
    if (vector_) {
      shape_[0] = cols_;
      t_.ndim = 1;
      t_.shape = shape_;
      t_.strides = nullptr;
    } else {
      t_.ndim = 2;
      t_.shape = shape_;
      t_.strides = strides_;
    }
    return &t_;
  }
  void set_device(DLDevice d) { device_ = d; }

 private:
  int dtype_;
  int64_t rows_, cols_, stride_, offset_;
  bool vector_;
  std::vector<char> storage_;
  int64_t shape_[2] = {0, 0};
  int64_t strides_[2] = {0, 1};
  DLTensor t_{};
  DLDevice device_{kDLCPU, 0};
};

// A 1-D tensor of n elements (weights, biases, per-row statistics).
inline HostTensor vector_tensor(int dtype, int64_t n) {
  return HostTensor(dtype, 1, n, -1, 0, true);
}

// ||got - want|| / ||want|| (absolute when want is all zero); NaN when got has a NaN.
inline double rel_l2(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return NAN;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// As rel_l2, but relative to max(||want||, scale_norm): for results that cancel (a norm's dx
// of a one-element row is far smaller than the terms it is computed from), the error is measured
// against the size of those terms.
inline double rel_l2_scaled(const std::vector<double>& got, const std::vector<double>& want,
                            double scale_norm) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return NAN;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  den = std::max(std::sqrt(den), scale_norm);
  return den > 0 ? std::sqrt(num) / den : std::sqrt(num);
}

inline double l2_norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// Index of the first non-finite value, or -1.
inline int64_t first_nonfinite(const std::vector<double>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) return static_cast<int64_t>(i);
  return -1;
}

#define KH_EXPECT_CLOSE(got, want, tol, what)                                               \
  do {                                                                                      \
    const auto& kh_g = (got);                                                               \
    const auto& kh_w = (want);                                                              \
    ASSERT_EQ(kh_g.size(), kh_w.size()) << what;                                            \
    int64_t kh_bad = ::kh::kernels_test::first_nonfinite(kh_g);                             \
    EXPECT_EQ(kh_bad, -1) << what << ": element " << kh_bad                                 \
                          << " is not finite (unwritten or poisoned output)";               \
    double kh_err = ::kh::kernels_test::rel_l2(kh_g, kh_w);                                 \
    EXPECT_LE(kh_err, (tol)) << what << ": relative L2 error " << kh_err << " > " << (tol); \
  } while (0)

#define KH_EXPECT_CLOSE_SCALED(got, want, scale_norm, tol, what)                             \
  do {                                                                                       \
    const auto& kh_g = (got);                                                                \
    const auto& kh_w = (want);                                                               \
    ASSERT_EQ(kh_g.size(), kh_w.size()) << what;                                             \
    int64_t kh_bad = ::kh::kernels_test::first_nonfinite(kh_g);                              \
    EXPECT_EQ(kh_bad, -1) << what << ": element " << kh_bad                                  \
                          << " is not finite (unwritten or poisoned output)";                \
    double kh_err = ::kh::kernels_test::rel_l2_scaled(kh_g, kh_w, (scale_norm));             \
    EXPECT_LE(kh_err, (tol)) << what << ": error relative to max(|ref|, |terms|) " << kh_err \
                             << " > " << (tol);                                              \
  } while (0)

// Argument builders.
inline kh_arg_t targ(const DLTensor* t) {
  kh_arg_t a{};
  a.kind = KH_ARG_TENSOR;
  a.v.t = t;
  return a;
}
inline kh_arg_t farg(double f) {
  kh_arg_t a{};
  a.kind = KH_ARG_FLOAT;
  a.v.f = f;
  return a;
}
inline kh_arg_t iarg(int64_t i) {
  kh_arg_t a{};
  a.kind = KH_ARG_INT;
  a.v.i = i;
  return a;
}

// The built package directory of `name` (build/kernels/<name>).
inline std::filesystem::path package_dir(const std::string& name) {
  return std::filesystem::path(KH_KERNEL_PACKAGES_DIR) / name;
}

// A package loaded through the loader (preflight, dlopen, table validation).
class Package {
 public:
  explicit Package(const std::string& name)
      : Package(package_dir(name) / ("lib" + name + ".so"), 0) {}
  // A host library at any path (e.g. a copy of the package with cubins).
  Package(const std::filesystem::path& library, int) { module_ = &kh::load_module(library); }
  const kh_op_v1_t* op(const std::string& name) const {
    const kh_op_v1_t* o = module_->view.find_op(name);
    EXPECT_NE(o, nullptr) << "op " << name << " is not in the package";
    return o;
  }
  // Calls op `name`; on failure the status and the op's message are returned in `error`.
  int32_t call(const std::string& name, const std::vector<kh_arg_t>& args,
               std::string* error = nullptr, void* stream = nullptr) const {
    kh::clear_last_op_error();
    const kh_op_v1_t* o = op(name);
    if (!o) return KH_ERR_NOT_FOUND;
    int32_t s = o->call(args.data(), static_cast<int32_t>(args.size()), stream);
    if (error) *error = kh::last_op_error();
    return s;
  }
  const kh::LoadedModule& module() const { return *module_; }

 private:
  const kh::LoadedModule* module_;
};

#define KH_EXPECT_OK(status, error) ASSERT_EQ((status), KH_OK) << (error)

// Where ops run: the cpu executor hands host tensors to the op; a GPU executor mirrors them in
// device memory (tests/gpu/test_kernels_gpu.cpp). The same test cases run on both.
class Executor {
 public:
  virtual ~Executor() = default;
  // `t` as the op sees it (for a device: its current host contents, copied over).
  virtual const DLTensor* arg(HostTensor& t) = 0;
  // Calls the op; afterwards every tensor passed through arg() since the last call holds the
  // op's results on the host.
  virtual int32_t call(const Package& p, const std::string& op, const std::vector<kh_arg_t>& args,
                       std::string* error) = 0;
};

class CpuExecutor : public Executor {
 public:
  const DLTensor* arg(HostTensor& t) override { return t.dl(); }
  int32_t call(const Package& p, const std::string& op, const std::vector<kh_arg_t>& args,
               std::string* error) override {
    return p.call(op, args, error);
  }
};

}  // namespace kh::kernels_test
