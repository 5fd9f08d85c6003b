// The demo runtime's device kernels (tools/demo/device_kernels.cu) on a machine without a GPU:
// the embedded source compiles with the loader's NVRTC and options for sm_80 and sm_90a (NVRTC
// needs no GPU) with every entry point the wrappers look up, and the device building blocks fail
// clearly without a driver. tests/gpu/test_gpu_demo_device.cpp runs them against the host
// fallbacks on a GPU. The Linear's GEMM requests (forward, dx, accumulated dW) run through the
// same service on host pointers (device_id -1) against the host model's linear loops. The device
// runtime's slot set has FusedLinearCrossEntropy, whose own ops refuse (never called).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hub/base/error.h"
#include "loader/cuda_arch.h"
#include "loader/cuda_driver.h"
#include "loader/nvrtc.h"
#include "tools/demo/device_kernels.h"
#include "tools/demo/device_linear.h"
#include "tools/demo/device_tensor.h"
#include "tools/demo/fallback_ops.h"
#include "tools/demo/layers.h"

namespace kh::demo {
namespace {

TEST(DemoDeviceKernels, SourceCompilesForAmpereAndHopperWithEveryEntryPoint) {
  const NvrtcInfo* compiler = nullptr;
  try {
    compiler = &nvrtc();
  } catch (const Error& e) {
    GTEST_SKIP() << "no NVRTC: " << e.what();
  }
  const std::string source = device_kernels_source();
  EXPECT_EQ(source.find("#include"), std::string::npos) << "the prelude is inlined";
  for (const char* target : {"sm_80", "sm_90a"}) {
    const CudaArch arch = *CudaArch::parse(target);
    std::string cubin;
    try {
      cubin = nvrtc_compile_cubin(source, "demo_device_kernels.cu",
                                  nvrtc_options(arch, compiler->version), "demo_device_kernels.cu");
    } catch (const Error& e) {
      FAIL() << target << ": " << e.what();
    }
    EXPECT_GT(cubin.size(), 1000u) << target;
    for (const std::string& name : device_kernel_names())
      EXPECT_NE(cubin.find(name + '\0'), std::string::npos) << target << " lacks " << name;
  }
}

TEST(DemoDeviceKernels, NoDriverIsAClearError) {
  if (cuda::cuda_driver_attempted()) GTEST_SKIP() << "the driver was used in this process";
  setenv("KERNEL_HUB_LIBCUDA", "libcuda-absent-for-this-test.so.1", 1);
  try {
    DeviceKernels kernels(0);
    FAIL() << "device kernels without a driver";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("no NVIDIA driver on this machine"), std::string::npos)
        << e.what();
  }
}

TEST(DemoDeviceSlots, TheDeviceRuntimeHasTheFusedSlotsWhoseOwnOpsRefuse) {
  Runtime cpu_runtime;
  const DemoSlots host = add_demo_slots(cpu_runtime);
  EXPECT_EQ(host.linear_cross_entropy, kNoSlot) << "the CPU model has five slots";
  EXPECT_EQ(host.fused_add_rms_norm, kNoSlot) << "the CPU model has five slots";
  Runtime rt;
  const DemoSlots s = add_device_demo_slots(rt);
  ASSERT_NE(s.linear_cross_entropy, kNoSlot);
  EXPECT_EQ(rt.slot_name(s.linear_cross_entropy), "FusedLinearCrossEntropy");
  EXPECT_EQ(rt.slot_name(s.attention), "Attention");
  // The device model never calls the slot's own ops (its chunked loss is the fallback): they
  // refuse, saying so, rather than compute anything.
  for (Mode mode : {Mode::kEval, Mode::kTrain}) {
    rt.set_mode(mode);
    EXPECT_EQ(rt.forward(s.linear_cross_entropy, kCpuDevice, nullptr, 0, nullptr),
              KH_ERR_UNSUPPORTED);
    EXPECT_NE(last_op_error().find("chunked loss"), std::string::npos) << last_op_error();
    // FusedAddRMSNorm likewise: without a package the model adds and runs the RMSNorm slot.
    EXPECT_EQ(rt.slot_name(s.fused_add_rms_norm), "FusedAddRMSNorm");
    EXPECT_EQ(rt.forward(s.fused_add_rms_norm, kCpuDevice, nullptr, 0, nullptr),
              KH_ERR_UNSUPPORTED);
    EXPECT_EQ(rt.backward(s.fused_add_rms_norm, kCpuDevice, nullptr, 0, nullptr),
              KH_ERR_UNSUPPORTED);
    EXPECT_NE(last_op_error().find("RMSNorm slot"), std::string::npos) << last_op_error();
    // SiluAndMulRecompute likewise: without a package the model runs SiluAndMul again.
    EXPECT_EQ(rt.slot_name(s.silu_and_mul_recompute), "SiluAndMulRecompute");
    EXPECT_EQ(rt.backward(s.silu_and_mul_recompute, kCpuDevice, nullptr, 0, nullptr),
              KH_ERR_UNSUPPORTED);
    EXPECT_NE(last_op_error().find("SiluAndMul slot"), std::string::npos) << last_op_error();
    // The FromOutput slots: without a package the model keeps the inputs.
    for (uint32_t slot : {s.fused_add_rms_norm_from_output, s.qk_norm_rotary_from_output}) {
      ASSERT_NE(slot, kNoSlot);
      EXPECT_EQ(rt.backward(slot, kCpuDevice, nullptr, 0, nullptr), KH_ERR_UNSUPPORTED);
      EXPECT_NE(last_op_error().find("keeps the forward's inputs"), std::string::npos)
          << last_op_error();
    }
    EXPECT_EQ(rt.slot_name(s.fused_add_rms_norm_from_output), "FusedAddRMSNormFromOutput");
    EXPECT_EQ(rt.slot_name(s.qk_norm_rotary_from_output), "QKNormRotaryEmbeddingFromOutput");
  }
}

TEST(DemoDeviceKernels, DtypeNames) {
  EXPECT_EQ(dtype_name(kF32), "float32");
  EXPECT_EQ(dtype_name(kBF16), "bfloat16");
  EXPECT_EQ(dtype_name(kI64), "int64");
  EXPECT_TRUE(same_dtype(kF32, DLDataType{kDLFloat, 32, 1}));
  EXPECT_FALSE(same_dtype(kF32, kBF16));
}

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4f * (1.f + std::fabs(want[i]))) << what << "[" << i << "]";
}

TEST(DemoDeviceLinear, GemmRequestsMatchTheHostLinear) {
  const LinearShape s{13, 37, 21};
  std::vector<float> x = random_vector(s.rows * s.in, 1), w = random_vector(s.out * s.in, 2),
                     dy = random_vector(s.rows * s.out, 3);
  std::vector<float> y(s.rows * s.out), want_y(s.rows * s.out);
  ASSERT_EQ(gemm(linear_forward_gemm(-1, KH_DTYPE_FP32, s, x.data(), w.data(), y.data())), KH_OK)
      << last_op_error();
  linear_forward(x.data(), w.data(), nullptr, want_y.data(), s.rows, s.in, s.out);
  expect_near_all(y, want_y, "y");

  // dx (overwritten, then accumulated) and dW (accumulated onto what is there).
  std::vector<float> dx(s.rows * s.in, 7.f), dw(s.out * s.in, 0.5f);
  std::vector<float> want_dx(s.rows * s.in), want_dw(s.out * s.in, 0.5f);
  ASSERT_EQ(gemm(linear_dx_gemm(-1, KH_DTYPE_FP32, s, dy.data(), w.data(), dx.data(), false)),
            KH_OK)
      << last_op_error();
  ASSERT_EQ(gemm(linear_dw_gemm(-1, KH_DTYPE_FP32, s, dy.data(), x.data(), dw.data())), KH_OK)
      << last_op_error();
  linear_backward(x.data(), w.data(), dy.data(), want_dx.data(), want_dw.data(), nullptr, s.rows,
                  s.in, s.out, false);
  expect_near_all(dx, want_dx, "dx");
  expect_near_all(dw, want_dw, "dw");
  ASSERT_EQ(gemm(linear_dx_gemm(-1, KH_DTYPE_FP32, s, dy.data(), w.data(), dx.data(), true)), KH_OK)
      << last_op_error();
  for (float& v : want_dx) v *= 2.f;
  expect_near_all(dx, want_dx, "dx accumulated");

  // dW overwritten (accumulate false: a gradient zero in value, its memory not cleared): what was
  // there, NaN included, is not read (beta 0).
  std::vector<float> fresh(s.out * s.in, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> want_fresh(s.out * s.in, 0.f), unused(s.rows * s.in);
  ASSERT_EQ(gemm(linear_dw_gemm(-1, KH_DTYPE_FP32, s, dy.data(), x.data(), fresh.data(), false)),
            KH_OK)
      << last_op_error();
  linear_backward(x.data(), w.data(), dy.data(), unused.data(), want_fresh.data(), nullptr, s.rows,
                  s.in, s.out, false);
  expect_near_all(fresh, want_fresh, "dw overwritten");
}

}  // namespace
}  // namespace kh::demo
