// FusedLinearCrossEntropy on a GPU (CTest label gpu; skipped without libcuda.so.1 or a device):
// the softmax package's cuda ops through the real loader (NVRTC from softmax.cu) with their GEMMs
// through the loader's GEMM service (cuBLASLt), on device copies of the cpu test's cases and
// GPU-sized ones, against the same float64 reference: loss, d_hidden, d_weight, backward, a
// fully ignored batch, several chunks, bf16/fp16/fp32. Without cuBLASLt the calls fail with
// KH_ERR_NO_DEVICE and a message naming what to install.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "tests/gpu/kernels_gpu_util.h"
#include "tests/unit/test_kernels_linear_ce_cases.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

class KernelsGpuLinearCe : public GpuKernelsTest<KernelsGpuLinearCe> {
 public:
  static constexpr const char* kJitDirName = "kh-kernels-linear-ce-jit";
};

const linear_ce_cases::Case kGpuCases[] = {
    {256, 4099, 128, 64, 7, true, 0},     // odd vocab (scalar path), 4 chunks
    {300, 4096, 64, 300, 0, false, 8},    // one chunk, strided hidden, input-dtype gradients
    {128, 2048, 96, 16, 1, true, 0},      // every token ignored
    {1024, 4099, 128, 128, 7, false, 0},  // input-dtype d_weight over 8 chunks (the bridge's)
};

TEST_F(KernelsGpuLinearCe, EveryDtypeAndShapeMatchesFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  Package pkg("softmax");
  GpuExecutor gpu;
  for (int dtype : {kBF16, kFP16, kFP32}) {
    for (const auto& k : linear_ce_cases::kCases) {
      linear_ce_cases::run_case(gpu, pkg, dtype, k, rng);
      if (HasFatalFailure()) return;
    }
    for (const auto& k : kGpuCases) {
      linear_ce_cases::run_case(gpu, pkg, dtype, k, rng);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace kh::kernels_test
