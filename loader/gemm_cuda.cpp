#include "loader/gemm_cuda.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "hub/base/error.h"
#include "loader/cublaslt.h"
#include "loader/cuda_driver.h"
#include "loader/gemm_service.h"

namespace kh {

namespace {

using namespace kh::cublaslt;

int data_type(uint32_t dtype) {
  switch (dtype) {
    case KH_DTYPE_BF16:
      return CUDA_R_16BF;
    case KH_DTYPE_FP16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// Everything the descriptors and the algorithm choice depend on.
struct ShapeKey {
  int32_t device;
  uint32_t flags, dtype_ab, dtype_d;
  int64_t m, n, k, lda, ldb, ldd, batch, stride_a, stride_b, stride_d;
  uint32_t align_a, align_b, align_d;
  uint64_t workspace;  // bytes offered: kGemmWorkspaceBytes, or 0 (a capture on a new stream)
  auto tie() const {
    return std::tie(device, flags, dtype_ab, dtype_d, m, n, k, lda, ldb, ldd, batch, stride_a,
                    stride_b, stride_d, align_a, align_b, align_d, workspace);
  }
  bool operator<(const ShapeKey& o) const { return tie() < o.tie(); }
};

// Descriptors and the chosen algorithm for one shape; never destroyed (cached for the process).
struct Plan {
  MatmulDesc desc = nullptr;
  MatrixLayout a = nullptr, b = nullptr, d = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  MatmulAlgo algo{};
  size_t workspace = 0;
};

struct DeviceState {
  Handle handle = nullptr;
  std::map<void*, cuda::CUdeviceptr> workspaces;  // per stream
};

struct State {
  std::shared_mutex mutex;
  std::map<int32_t, DeviceState> devices;
  std::map<ShapeKey, std::unique_ptr<Plan>> plans;
};

State& state() {
  static State* s = new State;  // never destroyed: handles and memory live with the process
  return *s;
}

void check_lt(Status status, const char* what) {
  if (status != kSuccess)
    throw Error(ErrorKind::kIo, fmt::format("{} failed: {}", what, status_text(status)));
}

std::string describe(const kh_gemm_t& g) {
  return fmt::format("{}{}[{}, {}] x [{}, {}] -> {} [{}, {}]{}", gemm_dtype_name(g.dtype_ab),
                     g.flags & KH_GEMM_TRANS_A ? " A^T" : "", g.m, g.k, g.k, g.n,
                     gemm_dtype_name(g.dtype_d), g.m, g.n,
                     g.batch > 1 ? fmt::format(", batch {}", g.batch) : std::string());
}

// g's product with `algo` (its workspace needs `workspace_bytes`) into `d` (g.d, or scratch memory
// of its size) on `stream`. cuBLASLt's A is our B and its B our A (header comment).
Status matmul(const Api& lt, Handle handle, const Plan& plan, const MatmulAlgo& algo,
              size_t workspace_bytes, const kh_gemm_t& g, void* d, cuda::CUdeviceptr workspace,
              void* stream) {
  const float alpha = g.alpha, beta = (g.flags & KH_GEMM_ACCUMULATE) ? g.beta : 0.f;
  return lt.cublasLtMatmul(handle, plan.desc, &alpha, g.b, plan.a, g.a, plan.b, &beta, d, plan.d, d,
                           plan.d, &algo, reinterpret_cast<void*>(workspace), workspace_bytes,
                           stream);
}

// Times results[0, n) for `g` on `stream` (after the work queued there, which produces the
// inputs), D written to scratch memory of D's size, and returns the fastest's index: 0 where
// nothing could be timed (no memory for the scratch: the heuristic's first is kept).
int fastest(const Api& lt, Handle handle, const Plan& plan, const HeuristicResult* results, int n,
            const kh_gemm_t& g, void* stream, cuda::CUdeviceptr workspace) {
  const cuda::Driver& d = cuda::cuda_driver();
  if (!d.cuMemAlloc || !d.cuMemFree || !d.cuEventCreate || !d.cuEventRecord ||
      !d.cuEventSynchronize || !d.cuEventElapsedTime || !d.cuEventDestroy)
    return 0;
  const size_t elem = g.dtype_d == KH_DTYPE_FP32 ? 4 : 2;
  const size_t d_bytes = static_cast<size_t>(g.ldd * (g.m - 1) + g.n) * elem;
  cuda::CUdeviceptr scratch = 0;
  if (d.cuMemAlloc(&scratch, d_bytes) != cuda::CUDA_SUCCESS) return 0;
  cuda::CUevent start = nullptr, end = nullptr;
  int best = 0;
  if (d.cuEventCreate(&start, cuda::CU_EVENT_DEFAULT) == cuda::CUDA_SUCCESS &&
      d.cuEventCreate(&end, cuda::CU_EVENT_DEFAULT) == cuda::CUDA_SUCCESS) {
    auto* out = reinterpret_cast<void*>(scratch);
    float best_ms = std::numeric_limits<float>::infinity();
    for (int i = 0; i < n; ++i) {
      auto run = [&] {
        return matmul(lt, handle, plan, results[i].algo, results[i].workspace_size, g, out,
                      workspace, stream);
      };
      if (run() != kSuccess) continue;  // a warm-up; a candidate that fails is not chosen
      auto* s = static_cast<cuda::CUstream>(stream);
      bool ok = d.cuEventRecord(start, s) == cuda::CUDA_SUCCESS;
      for (int r = 0; r < 3 && ok; ++r) ok = run() == kSuccess;
      float ms = 0;
      ok = ok && d.cuEventRecord(end, s) == cuda::CUDA_SUCCESS &&
           d.cuEventSynchronize(end) == cuda::CUDA_SUCCESS &&
           d.cuEventElapsedTime(&ms, start, end) == cuda::CUDA_SUCCESS;
      if (ok && ms < best_ms) {
        best_ms = ms;
        best = i;
      }
    }
  }
  // Every run issued above has finished before the scratch memory goes (a candidate whose timing
  // failed may have run after the last `end` recorded).
  if (end && d.cuEventRecord(end, static_cast<cuda::CUstream>(stream)) == cuda::CUDA_SUCCESS)
    d.cuEventSynchronize(end);
  if (start) d.cuEventDestroy(start);
  if (end) d.cuEventDestroy(end);
  d.cuMemFree(scratch);
  return best;
}

// Creates the descriptors for `key` and chooses its algorithm: the heuristic's first, or with
// `autotune` (the stream not capturing, batch 1) the fastest of its first candidates on `stream`.
// Throws kh::Error (kUnsupported when no algorithm fits).
std::unique_ptr<Plan> make_plan(const Api& lt, Handle handle, const kh_gemm_t& g,
                                const ShapeKey& key, bool autotune, void* stream,
                                cuda::CUdeviceptr workspace) {
  auto plan = std::make_unique<Plan>();
  const bool ta = g.flags & KH_GEMM_TRANS_A, tb = g.flags & KH_GEMM_TRANS_B;
  check_lt(lt.cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "cublasLtMatmulDescCreate");
  const int32_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  const int32_t op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is our A
  check_lt(lt.cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                             sizeof(op_a)),
           "cublasLtMatmulDescSetAttribute(TRANSA)");
  check_lt(lt.cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                             sizeof(op_b)),
           "cublasLtMatmulDescSetAttribute(TRANSB)");
  // Column-major views: our row-major [r, c] is [c, r] column-major with the same ld.
  const int ab = data_type(g.dtype_ab);
  auto layout = [&](MatrixLayout& out, int type, int64_t rows, int64_t cols, int64_t ld,
                    int64_t stride, const char* what) {
    check_lt(lt.cublasLtMatrixLayoutCreate(&out, type, static_cast<uint64_t>(rows),
                                           static_cast<uint64_t>(cols), ld),
             what);
    if (g.batch > 1) {
      const int32_t count = static_cast<int32_t>(g.batch);
      check_lt(lt.cublasLtMatrixLayoutSetAttribute(out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                   sizeof(count)),
               what);
      check_lt(lt.cublasLtMatrixLayoutSetAttribute(out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                   &stride, sizeof(stride)),
               what);
    }
  };
  // Our B stored [k, n] (or [n, k] transposed) reads column-major as [n, k] (or [k, n]).
  layout(plan->a, ab, tb ? g.k : g.n, tb ? g.n : g.k, g.ldb, g.stride_b, "layout of B");
  // Our A stored [m, k] (or [k, m]) reads column-major as [k, m] (or [m, k]).
  layout(plan->b, ab, ta ? g.m : g.k, ta ? g.k : g.m, g.lda, g.stride_a, "layout of A");
  layout(plan->d, data_type(g.dtype_d), g.n, g.m, g.ldd, g.stride_d, "layout of D");

  Preference pref = nullptr;
  check_lt(lt.cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace_bytes = key.workspace;
  const uint32_t align[4] = {key.align_b, key.align_a, key.align_d, key.align_d};
  Status st = lt.cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes));
  const int align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && st == kSuccess; ++i)
    st = lt.cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof(align[i]));
  const int wanted =
      autotune && g.batch == 1
          ? std::max(1, gemm_autotune_candidates(std::getenv("KERNEL_HUB_GEMM_AUTOTUNE")))
          : 1;
  std::vector<HeuristicResult> results(static_cast<size_t>(wanted));
  int returned = 0;
  if (st == kSuccess)
    st = lt.cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->d, plan->d,
                                           pref, wanted, results.data(), &returned);
  lt.cublasLtMatmulPreferenceDestroy(pref);
  if (st != kSuccess || returned < 1)
    throw Error(
        ErrorKind::kUnsupported,
        fmt::format("cuBLASLt has no algorithm for {} on CUDA device {} with pointers "
                    "aligned to {}/{}/{} bytes and lda {}, ldb {}, ldd {} ({}); align a, b "
                    "and d to 16 bytes and make leading dimensions multiples of 8",
                    describe(g), g.device_id, key.align_a, key.align_b, key.align_d, g.lda, g.ldb,
                    g.ldd, st != kSuccess ? status_text(st) : "the heuristic returned none"));
  const int chosen =
      returned > 1 ? fastest(lt, handle, *plan, results.data(), returned, g, stream, workspace) : 0;
  plan->algo = results[static_cast<size_t>(chosen)].algo;
  plan->workspace = results[static_cast<size_t>(chosen)].workspace_size;
  return plan;
}

}  // namespace

int gemm_autotune_candidates(const char* env_value) {
  if (!env_value || !*env_value) return kGemmAutotuneCandidates;
  char* end = nullptr;
  const long n = std::strtol(env_value, &end, 10);
  if (*end || n < 0 || n > 64 || env_value[0] < '0' || env_value[0] > '9')
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("KERNEL_HUB_GEMM_AUTOTUNE={}: expected how many of cuBLASLt's "
                            "candidate algorithms a new GEMM shape times, 0 to 64 (0 or 1: keep "
                            "the heuristic's first choice)",
                            env_value));
  return static_cast<int>(n);
}

uint32_t pointer_alignment(const void* address) {
  const auto bits = reinterpret_cast<uintptr_t>(address);
  uint32_t align = 256;
  while (align > 1 && bits % align != 0) align /= 2;
  return align;
}

int32_t gemm_cuda(const kh_gemm_t& g, void* stream, std::string& error) {
  if (g.m > INT32_MAX || g.n > INT32_MAX || g.k > INT32_MAX || g.batch > INT32_MAX) {
    error = fmt::format("{}: cuBLASLt takes sizes and batch counts up to {}; split the product",
                        describe(g), INT32_MAX);
    return KH_ERR_UNSUPPORTED;
  }
  const cuda::DeviceInfo* device = nullptr;
  const Api* lt = nullptr;
  try {
    device = &cuda::device(g.device_id);
    lt = &kh::cublaslt::cublaslt();
  } catch (const Error& e) {
    error = fmt::format("cannot run {} on CUDA device {}: {}", describe(g), g.device_id, e.what());
    return KH_ERR_NO_DEVICE;
  }
  ShapeKey key{g.device_id,
               g.flags,
               g.dtype_ab,
               g.dtype_d,
               g.m,
               g.n,
               g.k,
               g.lda,
               g.ldb,
               g.ldd,
               g.batch,
               g.stride_a,
               g.stride_b,
               g.stride_d,
               pointer_alignment(g.a),
               pointer_alignment(g.b),
               pointer_alignment(g.d),
               kGemmWorkspaceBytes};
  State& s = state();
  try {
    cuda::ScopedContext scope(device->primary_context);
    Handle handle = nullptr;
    const Plan* plan = nullptr;
    cuda::CUdeviceptr workspace = 0;
    {
      std::shared_lock lock(s.mutex);
      auto dev = s.devices.find(g.device_id);
      if (dev != s.devices.end()) {
        handle = dev->second.handle;
        auto ws = dev->second.workspaces.find(stream);
        if (ws != dev->second.workspaces.end()) workspace = ws->second;
      }
      auto it = s.plans.find(key);
      if (it != s.plans.end()) plan = it->second.get();
    }
    // A stream first seen while it captures a CUDA graph gets no workspace (cuMemAlloc is not
    // allowed during a capture): its plans are chosen for none, which every shape has.
    if (!workspace && handle &&
        cuda::stream_capture_status(static_cast<cuda::CUstream>(stream)) !=
            cuda::CU_STREAM_CAPTURE_STATUS_NONE) {
      key.workspace = 0;
      std::shared_lock lock(s.mutex);
      auto it = s.plans.find(key);
      plan = it != s.plans.end() ? it->second.get() : nullptr;
    }
    if (!handle || (!workspace && key.workspace) || !plan) {
      const bool capturing = cuda::stream_capture_status(static_cast<cuda::CUstream>(stream)) !=
                             cuda::CU_STREAM_CAPTURE_STATUS_NONE;
      std::unique_lock lock(s.mutex);
      DeviceState& dev = s.devices[g.device_id];
      if (!dev.handle) check_lt(lt->cublasLtCreate(&dev.handle), "cublasLtCreate");
      handle = dev.handle;
      cuda::CUdeviceptr unused = 0;
      cuda::CUdeviceptr& ws = key.workspace ? dev.workspaces[stream] : unused;
      if (!ws && key.workspace) {
        const cuda::Driver& d = cuda::cuda_driver();
        if (!d.cuMemAlloc)
          throw Error(ErrorKind::kUnsupported, "the CUDA driver has no cuMemAlloc");
        cuda::check(d.cuMemAlloc(&ws, kGemmWorkspaceBytes),
                    fmt::format("cuMemAlloc of the GEMM workspace ({} MiB) on CUDA device {}",
                                kGemmWorkspaceBytes >> 20, g.device_id));
      }
      workspace = ws;
      auto& slot = s.plans[key];
      if (!slot) slot = make_plan(*lt, handle, g, key, !capturing, stream, workspace);
      plan = slot.get();
    }
    Status st = matmul(*lt, handle, *plan, plan->algo, plan->workspace, g, g.d, workspace, stream);
    if (st != kSuccess) {
      error = fmt::format("cublasLtMatmul failed for {} on CUDA device {}: {}", describe(g),
                          g.device_id, status_text(st));
      return KH_ERR_LAUNCH;
    }
    return KH_OK;
  } catch (const Error& e) {
    error = fmt::format("{} on CUDA device {}: {}", describe(g), g.device_id, e.what());
    return e.kind() == ErrorKind::kUnsupported    ? KH_ERR_UNSUPPORTED
           : e.kind() == ErrorKind::kInvalidInput ? KH_ERR_INVALID_ARGUMENT
                                                  : KH_ERR_LAUNCH;
  }
}

}  // namespace kh
