// cuBLASLt, loaded lazily with dlopen (KERNEL_HUB_CUBLASLT, then libcublasLt.so.13, .so.12 and the
// same under /usr/local/cuda/lib64), so the build needs no CUDA toolkit and a machine without
// cuBLASLt still runs everything but the GEMM service on a GPU. The few types, values and
// prototypes used are declared below, mirroring cublasLt.h / cublas_api.h / library_types.h
// (CUDA 12 and 13 agree on all of them).
//
// KERNEL_HUB_CUBLASLT: a libcublasLt .so file, or a directory holding libcublasLt.so.13 / .so.12
// (for example the nvidia-cublas wheel's lib folder), tried first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kh::cublaslt {

// --- declarations mirroring cublasLt.h ---
using Status = int;  // cublasStatus_t
constexpr Status kSuccess = 0;
struct Context;
using Handle = Context*;  // cublasLtHandle_t
struct MatmulDescOpaque;
using MatmulDesc = MatmulDescOpaque*;  // cublasLtMatmulDesc_t
struct MatrixLayoutOpaque;
using MatrixLayout = MatrixLayoutOpaque*;  // cublasLtMatrixLayout_t
struct PreferenceOpaque;
using Preference = PreferenceOpaque*;  // cublasLtMatmulPreference_t
struct MatmulAlgo {
  uint64_t data[8];
};
struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  MatmulAlgo algo;
  size_t workspace_size;
  Status state;
  float waves_count;
  int reserved[4];
};
static_assert(sizeof(HeuristicResult) == 96);

// cudaDataType_t
constexpr int CUDA_R_32F = 0;
constexpr int CUDA_R_16F = 2;
constexpr int CUDA_R_16BF = 14;
// cublasComputeType_t: fp32 accumulation, fp32 inputs never rounded to TF32.
constexpr int CUBLAS_COMPUTE_32F = 68;
// cublasOperation_t
constexpr int32_t CUBLAS_OP_N = 0;
constexpr int32_t CUBLAS_OP_T = 1;
// cublasLtMatmulDescAttributes_t
constexpr int CUBLASLT_MATMUL_DESC_TRANSA = 3;
constexpr int CUBLASLT_MATMUL_DESC_TRANSB = 4;
// cublasLtMatrixLayoutAttribute_t
constexpr int CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5;           // int32_t
constexpr int CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6;  // int64_t
// cublasLtMatmulPreferenceAttributes_t
constexpr int CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1;    // uint64_t
constexpr int CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5;  // uint32_t, default 256
constexpr int CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6;
constexpr int CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7;
constexpr int CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8;

// clang-format off
// Every entry point used, each named once: X(return type, name, (parameters)).
#define KH_CUBLASLT_FUNCTIONS(X)                                                                  \
  X(Status, cublasLtCreate, (Handle* handle))                                                     \
  X(size_t, cublasLtGetVersion, ())                                                               \
  X(const char*, cublasLtGetStatusString, (Status status))                                        \
  X(Status, cublasLtMatmulDescCreate, (MatmulDesc* desc, int compute_type, int scale_type))       \
  X(Status, cublasLtMatmulDescSetAttribute, (MatmulDesc desc, int attr, const void* buf,          \
                                            size_t size))                                         \
  X(Status, cublasLtMatrixLayoutCreate, (MatrixLayout* layout, int type, uint64_t rows,           \
                                        uint64_t cols, int64_t ld))                               \
  X(Status, cublasLtMatrixLayoutSetAttribute, (MatrixLayout layout, int attr, const void* buf,    \
                                              size_t size))                                       \
  X(Status, cublasLtMatmulPreferenceCreate, (Preference* pref))                                   \
  X(Status, cublasLtMatmulPreferenceSetAttribute, (Preference pref, int attr, const void* buf,    \
                                                  size_t size))                                   \
  X(Status, cublasLtMatmulPreferenceDestroy, (Preference pref))                                   \
  X(Status, cublasLtMatmulAlgoGetHeuristic,                                                       \
    (Handle handle, MatmulDesc desc, MatrixLayout a, MatrixLayout b, MatrixLayout c,              \
     MatrixLayout d, Preference pref, int requested, HeuristicResult* results, int* returned))    \
  X(Status, cublasLtMatmul,                                                                       \
    (Handle handle, MatmulDesc desc, const void* alpha, const void* a, MatrixLayout a_layout,     \
     const void* b, MatrixLayout b_layout, const void* beta, const void* c,                       \
     MatrixLayout c_layout, void* d, MatrixLayout d_layout, const MatmulAlgo* algo,               \
     void* workspace, size_t workspace_bytes, void* stream))
// clang-format on

struct Api {
  std::string library;  // what was dlopen'ed
  size_t version = 0;   // cublasLtGetVersion: major * 10000 + minor * 100 + patch
#define KH_CUBLASLT_FIELD(ret, name, params) ret(*name) params = nullptr;
  KH_CUBLASLT_FUNCTIONS(KH_CUBLASLT_FIELD)
#undef KH_CUBLASLT_FIELD
};

// The names tried, in order.
std::vector<std::string> candidates();

// Loads cuBLASLt on first use (std::call_once; a failure is remembered). Throws kh::Error
// (kNotFound) listing every name tried and what to install, or (kUnsupported) naming the entry
// points the library lacks.
const Api& cublaslt();

// "CUBLAS_STATUS_NOT_SUPPORTED" (the library's text) or "cublasStatus_t N".
std::string status_text(Status status);

}  // namespace kh::cublaslt
