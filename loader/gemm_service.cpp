#include "loader/gemm_service.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include <fmt/format.h>

#include "kernel_hub/kernel_hub.hpp"
#include "loader/abi_request.h"
#include "loader/gemm_cpu.h"
#include "loader/gemm_cuda.h"

namespace kh {

static_assert(sizeof(kh_gemm_t) == kGemmV1_2Size, "kh_gemm_t of ABI 1.2 is 136 bytes");

namespace {

bool one_dtype(uint32_t code) {
  return code == KH_DTYPE_BF16 || code == KH_DTYPE_FP16 || code == KH_DTYPE_FP32;
}

// Elements a row-major [rows, cols] matrix with leading dimension ld spans, and the same
// for `batch` of them `stride` apart: false when either overflows int64 (or its byte size does).
bool extent(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride,
            int64_t element_bytes, int64_t& elements) {
  int64_t last_row = 0, span = 0, last_batch = 0, bytes = 0;
  if (__builtin_mul_overflow(rows - 1, ld, &last_row)) return false;
  if (__builtin_add_overflow(last_row, cols, &span)) return false;
  if (__builtin_mul_overflow(batch - 1, stride, &last_batch)) return false;
  if (__builtin_add_overflow(last_batch, span, &elements)) return false;
  return !__builtin_mul_overflow(elements, element_bytes, &bytes);
}

}  // namespace

int64_t gemm_dtype_bytes(uint32_t code) {
  return code == KH_DTYPE_FP32 ? 4 : 2;
}

const char* gemm_dtype_name(uint32_t code) {
  switch (code) {
    case KH_DTYPE_BF16:
      return "bf16";
    case KH_DTYPE_FP16:
      return "fp16";
    case KH_DTYPE_FP32:
      return "fp32";
    default:
      return "unknown";
  }
}

int32_t read_gemm(const kh_gemm_t* in, kh_gemm_t& out, std::string& error) {
  if (const int32_t status = read_abi_request(in, out, kGemmV1_2Size, "kh_gemm_t", "1.2", error);
      status != KH_OK)
    return status;
  kh_gemm_t& g = out;
  if (g.flags & ~KH_GEMM_FLAGS_KNOWN) {
    error = fmt::format(
        "unknown flags 0x{:x} (known: KH_GEMM_TRANS_A, KH_GEMM_TRANS_B, "
        "KH_GEMM_ACCUMULATE = 0x{:x})",
        g.flags & ~KH_GEMM_FLAGS_KNOWN, KH_GEMM_FLAGS_KNOWN);
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (!one_dtype(g.dtype_ab) || !one_dtype(g.dtype_d)) {
    error = fmt::format(
        "dtype_ab {} / dtype_d {}: each must be one of KH_DTYPE_BF16 (1), "
        "KH_DTYPE_FP16 (2), KH_DTYPE_FP32 (4)",
        g.dtype_ab, g.dtype_d);
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (g.dtype_d != g.dtype_ab && g.dtype_d != KH_DTYPE_FP32) {
    error =
        fmt::format("{} inputs with a {} result: D must be {} or fp32", gemm_dtype_name(g.dtype_ab),
                    gemm_dtype_name(g.dtype_d), gemm_dtype_name(g.dtype_ab));
    return KH_ERR_UNSUPPORTED;
  }
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0) {
    error = fmt::format("negative size: m {}, n {}, k {}, batch {}", g.m, g.n, g.k, g.batch);
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (g.batch == 0) g.batch = 1;
  if (!(g.flags & KH_GEMM_ACCUMULATE) && g.beta != 0.f) {
    error = fmt::format(
        "beta is {} without KH_GEMM_ACCUMULATE: D is only written then; set "
        "KH_GEMM_ACCUMULATE to add beta * D, or beta = 0",
        g.beta);
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (g.m == 0 || g.n == 0) return KH_OK;  // an empty product: nothing to read or write
  if (g.k == 0) {
    error = fmt::format("k is 0 for a [{}, {}] result: k must be >= 1", g.m, g.n);
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (!g.a || !g.b || !g.d) {
    error = fmt::format("null pointer: a {}, b {}, d {}", g.a ? "set" : "NULL",
                        g.b ? "set" : "NULL", g.d ? "set" : "NULL");
    return KH_ERR_INVALID_ARGUMENT;
  }
  const int64_t ab_bytes = gemm_dtype_bytes(g.dtype_ab), d_bytes = gemm_dtype_bytes(g.dtype_d);
  const struct {
    const char* name;
    const void* p;
    int64_t bytes;
  } pointers[] = {{"a", g.a, ab_bytes}, {"b", g.b, ab_bytes}, {"d", g.d, d_bytes}};
  for (const auto& q : pointers)
    if (reinterpret_cast<uintptr_t>(q.p) % static_cast<uintptr_t>(q.bytes) != 0) {
      error = fmt::format("{} ({}) is not aligned to its {}-byte elements", q.name, q.p, q.bytes);
      return KH_ERR_INVALID_ARGUMENT;
    }
  const bool ta = g.flags & KH_GEMM_TRANS_A, tb = g.flags & KH_GEMM_TRANS_B;
  // Stored shapes (row-major): A is [m,k] or, transposed, [k,m]; B is [k,n] or [n,k].
  const int64_t a_rows = ta ? g.k : g.m, a_cols = ta ? g.m : g.k;
  const int64_t b_rows = tb ? g.n : g.k, b_cols = tb ? g.k : g.n;
  struct Operand {
    const char *name, *ld_name, *stride_name, *stored;
    int64_t rows, cols, ld, stride, bytes;
  } operands[] = {
      {"A", "lda", "stride_a", ta ? " (KH_GEMM_TRANS_A: stored [k, m])" : " (stored [m, k])",
       a_rows, a_cols, g.lda, g.stride_a, gemm_dtype_bytes(g.dtype_ab)},
      {"B", "ldb", "stride_b", tb ? " (KH_GEMM_TRANS_B: stored [n, k])" : " (stored [k, n])",
       b_rows, b_cols, g.ldb, g.stride_b, gemm_dtype_bytes(g.dtype_ab)},
      {"D", "ldd", "stride_d", " ([m, n])", g.m, g.n, g.ldd, g.stride_d,
       gemm_dtype_bytes(g.dtype_d)}};
  for (const Operand& o : operands) {
    if (o.ld < o.cols) {
      error = fmt::format("{} is {}, shorter than a row of {}{}: {} must be >= {}", o.ld_name, o.ld,
                          o.name, o.stored, o.ld_name, o.cols);
      return KH_ERR_INVALID_ARGUMENT;
    }
    if (o.stride < 0) {
      error = fmt::format("{} is {}: batch strides must be >= 0", o.stride_name, o.stride);
      return KH_ERR_INVALID_ARGUMENT;
    }
    int64_t elements = 0;
    if (!extent(o.rows, o.cols, o.ld, g.batch, o.stride, o.bytes, elements)) {
      error = fmt::format(
          "{} spans more than int64 can address: [{}, {}] with ld {}, batch {}, "
          "stride {}",
          o.name, o.rows, o.cols, o.ld, g.batch, o.stride);
      return KH_ERR_INVALID_ARGUMENT;
    }
  }
  if (g.batch > 1 && g.stride_d < g.m * g.ldd) {
    error = fmt::format(
        "stride_d is {} for {} problems of [{}, {}] with ldd {}: results would "
        "overlap; stride_d must be >= m * ldd = {}",
        g.stride_d, g.batch, g.m, g.n, g.ldd, g.m * g.ldd);
    return KH_ERR_INVALID_ARGUMENT;
  }
  return KH_OK;
}

int32_t run_gemm(const kh_gemm_t* in, void* stream, std::string& error) noexcept {
  try {
    kh_gemm_t g;
    if (int32_t status = read_gemm(in, g, error); status != KH_OK) return status;
    if (g.m == 0 || g.n == 0) return KH_OK;
    if (g.device_id < 0) {
      gemm_cpu(g);
      return KH_OK;
    }
    return gemm_cuda(g, stream, error);
  } catch (const std::exception& e) {
    error = e.what();
    return KH_ERR_INTERNAL;
  } catch (...) {
    error = "unknown exception";
    return KH_ERR_INTERNAL;
  }
}

int32_t gemm(const kh_gemm_t& g, void* stream) noexcept {
  std::string error;
  int32_t status = run_gemm(&g, stream, error);
  if (status != KH_OK) {
    try {
      set_last_op_error("gemm: " + error);
    } catch (...) {
    }
  }
  return status;
}

}  // namespace kh
