#include "loader/device_function.h"

#include <fmt/format.h>

#include "hub/base/error.h"
#include "loader/launch_config.h"

namespace kh {

int32_t find_device_function(cuda::CUlibrary library, cuda::CUcontext context, int device,
                             const std::string& name, const std::string& where, DeviceFunction& out,
                             std::string& error) {
  const cuda::Driver& d = cuda::cuda_driver();
  DeviceFunction* f = &out;
  f->device = device;
  f->context = context;
  f->sm_major = cuda::device(device).sm_major;  // loaded: the library was loaded on it
  f->name = name;
  cuda::CUresult r = d.cuLibraryGetKernel(&f->kernel, library, name.c_str());
  if (r == cuda::CUDA_ERROR_NOT_FOUND) {
    error = fmt::format(
        "no kernel named {} in the device code for CUDA device {} ({}); kernels "
        "are looked up by their extern \"C\" __global__ name",
        name, device, where);
    return KH_ERR_NOT_FOUND;
  }
  if (r != cuda::CUDA_SUCCESS) {
    error = fmt::format("cuLibraryGetKernel({}) failed: {}", name, cuda::result_text(r));
    return KH_ERR_INTERNAL;
  }
  try {
    cuda::ScopedContext scope(context);
    cuda::check(d.cuKernelGetFunction(&f->function, f->kernel),
                fmt::format("cuKernelGetFunction({}) on CUDA device {}", name, device));
  } catch (const Error& err) {
    error = err.what();
    return KH_ERR_INTERNAL;
  }
  return KH_OK;
}

int32_t launch_device_function(void* fn, const kh_launch_cfg_t& cfg, void** args, void* stream,
                               std::string& error) {
  auto* f = static_cast<DeviceFunction*>(fn);
  if (!f || f->magic != kDeviceFunctionMagic) {
    error = "launch: the function handle did not come from get_function";
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (cfg.device_id != f->device) {
    error = fmt::format(
        "launch: kernel {} was looked up for CUDA device {} but cfg.device_id is "
        "{}; look it up for the device you launch on",
        f->name, f->device, cfg.device_id);
    return KH_ERR_INVALID_ARGUMENT;
  }
  LaunchPlan plan;
  if (int32_t status = plan_launch(cfg, f->sm_major, f->name, f->device, plan, error);
      status != KH_OK)
    return status;
  const cuda::Driver& d = cuda::cuda_driver();  // loaded: get_function succeeded
  if (plan.extended() && !d.cuLaunchKernelEx) {
    error = fmt::format(
        "launch of {}: a cluster or programmatic dependent launch needs cuLaunchKernelEx, which "
        "this NVIDIA driver (CUDA {}) lacks; update the driver",
        f->name, d.driver_version);
    return KH_ERR_LAUNCH;
  }
  // The function belongs to the device's primary context; make it current only if it is not.
  cuda::CUcontext current = nullptr;
  bool pushed = false;
  if (d.cuCtxGetCurrent(&current) != cuda::CUDA_SUCCESS || current != f->context) {
    cuda::CUresult r = d.cuCtxPushCurrent(f->context);
    if (r != cuda::CUDA_SUCCESS) {
      error =
          fmt::format("launch of {}: cuCtxPushCurrent failed: {}", f->name, cuda::result_text(r));
      return KH_ERR_LAUNCH;
    }
    pushed = true;
  }
  auto pop = [&] {
    if (!pushed) return;
    cuda::CUcontext popped = nullptr;
    d.cuCtxPopCurrent(&popped);
  };
  // Function attributes a launch needs, set once per function by the first launch that asks
  // (concurrent setters write the same or a larger value).
  auto set_attribute = [&](int attribute, int value, const char* name) -> bool {
    cuda::CUresult a = d.cuFuncSetAttribute ? d.cuFuncSetAttribute(f->function, attribute, value)
                                            : cuda::CUDA_ERROR_INVALID_VALUE;
    if (a == cuda::CUDA_SUCCESS) return true;
    error = fmt::format("launch of {}: cuFuncSetAttribute({}, {}) failed: {}", f->name, name, value,
                        d.cuFuncSetAttribute ? cuda::result_text(a) : "the driver lacks it");
    return false;
  };
  if (cfg.shared_mem_bytes > f->max_dynamic_smem.load(std::memory_order_acquire)) {
    // Above 48 KiB a kernel must opt in.
    if (!set_attribute(cuda::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                       static_cast<int>(cfg.shared_mem_bytes), "MAX_DYNAMIC_SHARED_SIZE_BYTES")) {
      pop();
      error += fmt::format(
          " ({} B of dynamic shared memory: more than the device allows per "
          "block?)",
          cfg.shared_mem_bytes);
      return KH_ERR_LAUNCH;
    }
    uint32_t seen = f->max_dynamic_smem.load(std::memory_order_relaxed);
    while (seen < cfg.shared_mem_bytes &&
           !f->max_dynamic_smem.compare_exchange_weak(seen, cfg.shared_mem_bytes)) {
    }
  }
  if (plan.non_portable_cluster && !f->non_portable_cluster.load(std::memory_order_acquire)) {
    if (!set_attribute(cuda::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1,
                       "NON_PORTABLE_CLUSTER_SIZE_ALLOWED")) {
      pop();
      return KH_ERR_LAUNCH;
    }
    f->non_portable_cluster.store(true, std::memory_order_release);
  }
  const auto cu_stream = static_cast<cuda::CUstream>(stream);
  cuda::CUresult r = cuda::CUDA_SUCCESS;
  if (!plan.extended()) {
    r = d.cuLaunchKernel(f->function, cfg.grid[0], cfg.grid[1], cfg.grid[2], cfg.block[0],
                         cfg.block[1], cfg.block[2], cfg.shared_mem_bytes, cu_stream, args,
                         nullptr);
  } else {
    cuda::CUlaunchAttribute attrs[2] = {};
    unsigned n = 0;
    if (plan.cluster) {
      attrs[n].id = cuda::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attrs[n].value.clusterDim = {plan.cluster_dims[0], plan.cluster_dims[1],
                                   plan.cluster_dims[2]};
      ++n;
    }
    if (plan.pdl) {
      attrs[n].id = cuda::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attrs[n].value.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    const cuda::CUlaunchConfig config = {
        cfg.grid[0],  cfg.grid[1],          cfg.grid[2], cfg.block[0], cfg.block[1],
        cfg.block[2], cfg.shared_mem_bytes, cu_stream,   attrs,        n};
    r = d.cuLaunchKernelEx(&config, f->function, args, nullptr);
  }
  pop();
  if (r != cuda::CUDA_SUCCESS) {
    error = fmt::format(
        "{}({}, grid {}x{}x{}, block {}x{}x{}, {} B shared{}{}) on CUDA device {} failed: {}",
        plan.extended() ? "cuLaunchKernelEx" : "cuLaunchKernel", f->name, cfg.grid[0], cfg.grid[1],
        cfg.grid[2], cfg.block[0], cfg.block[1], cfg.block[2], cfg.shared_mem_bytes,
        plan.cluster ? fmt::format(", cluster {}x{}x{}", plan.cluster_dims[0], plan.cluster_dims[1],
                                   plan.cluster_dims[2])
                     : std::string(),
        plan.pdl ? ", programmatic dependent launch" : "", f->device, cuda::result_text(r));
    return KH_ERR_LAUNCH;
  }
  return KH_OK;
}

}  // namespace kh
