#include "loader/gemm_cpu.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

namespace kh {

float bf16_bits_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t float_to_bf16_bits(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((u >> 16) | 0x40);  // stays a quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float fp16_bits_to_float(uint16_t bits) {
  const uint32_t sign = (bits & 0x8000u) << 16;
  const int exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ffu;
  float magnitude;
  if (exponent == 0)
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
  else if (exponent == 31)
    magnitude =
        mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), exponent - 25);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
}

uint16_t float_to_fp16_bits(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(value);
  if (std::isnan(value)) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 65520.f) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (a < 6.103515625e-05f) {
    // Subnormal: units of 2^-24, rounded to nearest even by rintf (default rounding mode).
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::rint(a * 16777216.f)));
  }
  const uint32_t ua = std::bit_cast<uint32_t>(a);
  uint32_t h = ((ua >> 23) - 112) << 10 | ((ua >> 13) & 0x3ffu);
  const uint32_t rest = ua & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
  return static_cast<uint16_t>(sign | h);
}

namespace {

// Block sizes: a [kRows x kDepth] panel of op(A) and a [kDepth x kCols] panel of op(B) in fp32
// (64 KiB + 256 KiB) and a [kRows x kCols] fp32 accumulator.
constexpr int64_t kRows = 64, kCols = 256, kDepth = 256;

float load(uint32_t dtype, const void* base, int64_t index) {
  switch (dtype) {
    case KH_DTYPE_BF16:
      return bf16_bits_to_float(static_cast<const uint16_t*>(base)[index]);
    case KH_DTYPE_FP16:
      return fp16_bits_to_float(static_cast<const uint16_t*>(base)[index]);
    default:
      return static_cast<const float*>(base)[index];
  }
}

void store(uint32_t dtype, void* base, int64_t index, float value) {
  switch (dtype) {
    case KH_DTYPE_BF16:
      static_cast<uint16_t*>(base)[index] = float_to_bf16_bits(value);
      break;
    case KH_DTYPE_FP16:
      static_cast<uint16_t*>(base)[index] = float_to_fp16_bits(value);
      break;
    default:
      static_cast<float*>(base)[index] = value;
  }
}

const void* offset(const void* base, int64_t elements, uint32_t dtype) {
  return static_cast<const char*>(base) + elements * (dtype == KH_DTYPE_FP32 ? 4 : 2);
}

void one_problem(const kh_gemm_t& g, const void* a, const void* b, void* d) {
  const bool ta = g.flags & KH_GEMM_TRANS_A, tb = g.flags & KH_GEMM_TRANS_B;
  const bool accumulate = g.flags & KH_GEMM_ACCUMULATE;
  std::vector<float> pa(kRows * kDepth), pb(kDepth * kCols), acc(kRows * kCols);
  for (int64_t i0 = 0; i0 < g.m; i0 += kRows) {
    const int64_t rows = std::min(kRows, g.m - i0);
    for (int64_t j0 = 0; j0 < g.n; j0 += kCols) {
      const int64_t cols = std::min(kCols, g.n - j0);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t p0 = 0; p0 < g.k; p0 += kDepth) {
        const int64_t depth = std::min(kDepth, g.k - p0);
        // op(A)[i, p] is a[i*lda + p], or a[p*lda + i] when transposed; op(B)[p, j] likewise.
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t p = 0; p < depth; ++p)
            pa[i * kDepth + p] =
                load(g.dtype_ab, a, ta ? (p0 + p) * g.lda + (i0 + i) : (i0 + i) * g.lda + (p0 + p));
        for (int64_t p = 0; p < depth; ++p)
          for (int64_t j = 0; j < cols; ++j)
            pb[p * kCols + j] =
                load(g.dtype_ab, b, tb ? (j0 + j) * g.ldb + (p0 + p) : (p0 + p) * g.ldb + (j0 + j));
        for (int64_t i = 0; i < rows; ++i) {
          float* out = &acc[i * kCols];
          for (int64_t p = 0; p < depth; ++p) {
            const float x = pa[i * kDepth + p];
            const float* row = &pb[p * kCols];
            for (int64_t j = 0; j < cols; ++j) out[j] += x * row[j];
          }
        }
      }
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t at = (i0 + i) * g.ldd + (j0 + j);
          float v = g.alpha * acc[i * kCols + j];
          if (accumulate) v += g.beta * load(g.dtype_d, d, at);
          store(g.dtype_d, d, at, v);
        }
    }
  }
}

}  // namespace

void gemm_cpu(const kh_gemm_t& g) {
  for (int64_t i = 0; i < g.batch; ++i)
    one_problem(g, offset(g.a, i * g.stride_a, g.dtype_ab), offset(g.b, i * g.stride_b, g.dtype_ab),
                const_cast<void*>(offset(g.d, i * g.stride_d, g.dtype_d)));
}

}  // namespace kh
