// The launch configuration a package hands host->launch (kh_launch_cfg_t): read by the writer's
// struct_size (fields of a newer ABI minor than the writer's read as 0), checked, and turned into
// what the driver is asked: cuLaunchKernel for a plain launch, cuLaunchKernelEx with attributes
// for a thread block cluster or programmatic dependent launch (PDL). No driver calls here, so
// every rule is testable without a GPU.
#pragma once

#include <cstdint>
#include <string>

#include "kernel_hub/kernel_hub_abi.h"

namespace kh {

// Blocks per cluster the loader allows: 8 is the portable limit; up to 16 the loader sets
// CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED (Hopper runs 16 when the kernel's shared
// memory and registers fit; otherwise the driver refuses the launch and says so).
constexpr uint32_t kPortableClusterBlocks = 8;
constexpr uint32_t kMaxClusterBlocks = 16;
// Clusters and PDL need compute capability 9.0.
constexpr int kClusterMinSmMajor = 9;

// How one launch goes to the driver.
struct LaunchPlan {
  bool cluster = false;  // a cluster of more than one block
  uint32_t cluster_dims[3] = {1, 1, 1};
  bool non_portable_cluster = false;  // more than kPortableClusterBlocks blocks per cluster
  bool pdl = false;                   // programmatic stream serialization allowed
  // cuLaunchKernelEx with attributes; false: plain cuLaunchKernel, as before ABI 1.1.
  bool extended() const { return cluster || pdl; }
};

// Copies *in into `out` as far as in->h.struct_size reaches (the rest of `out` is 0), then checks
// what needs no device: the ABI major, a struct_size of at least ABI 1.0's, cluster dims
// ({0,0,0} or each >= 1, each dividing the grid, at most kMaxClusterBlocks blocks) and flags
// (known bits only). KH_ERR_INVALID_ARGUMENT with `error` saying which field is wrong.
int32_t read_launch_cfg(const kh_launch_cfg_t* in, kh_launch_cfg_t& out, std::string& error);

// The plan for a cfg read_launch_cfg accepted, on a device of compute capability `sm_major`:
// a cluster below sm_90 is KH_ERR_LAUNCH (the kernel would run without the cluster it was
// written for); PDL below sm_90 is dropped (plain stream order is always correct: the kernel's
// griddepcontrol.wait is a no-op there). `kernel` and `device` name the launch in the error.
int32_t plan_launch(const kh_launch_cfg_t& cfg, int sm_major, const std::string& kernel, int device,
                    LaunchPlan& plan, std::string& error);

}  // namespace kh
