// The demo runtime's device kernels (tools/demo/device_kernels.cu) on a machine without a GPU:
// the embedded source compiles with the loader's NVRTC and options for sm_80 and sm_90a (NVRTC
// needs no GPU) with every entry point the wrappers look up, and the device building blocks fail
// clearly without a driver. tests/gpu/test_gpu_demo_device.cpp runs them against the host
// fallbacks on a GPU.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "hub/base/error.h"
#include "loader/cuda_arch.h"
#include "loader/cuda_driver.h"
#include "loader/nvrtc.h"
#include "tools/demo/device_kernels.h"
#include "tools/demo/device_tensor.h"

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

TEST(DemoDeviceKernels, DtypeNames) {
  EXPECT_EQ(dtype_name(kF32), "float32");
  EXPECT_EQ(dtype_name(kBF16), "bfloat16");
  EXPECT_EQ(dtype_name(kI64), "int64");
  EXPECT_TRUE(same_dtype(kF32, DLDataType{kDLFloat, 32, 1}));
  EXPECT_FALSE(same_dtype(kF32, kBF16));
}

}  // namespace
}  // namespace kh::demo
