#include "loader/launch_config.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include <fmt/format.h>

namespace kh {

static_assert(offsetof(kh_launch_cfg_t, cluster) == KH_LAUNCH_CFG_V1_0_SIZE,
              "ABI 1.1 fields start where ABI 1.0's kh_launch_cfg_t ended");

namespace {

bool no_cluster(const uint32_t (&c)[3]) {
  return (c[0] == 0 && c[1] == 0 && c[2] == 0) || (c[0] == 1 && c[1] == 1 && c[2] == 1);
}

}  // namespace

int32_t read_launch_cfg(const kh_launch_cfg_t* in, kh_launch_cfg_t& out, std::string& error) {
  out = kh_launch_cfg_t{};
  if (!in) {
    error = "launch called with a null kh_launch_cfg_t";
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (in->h.abi_major != KH_ABI_MAJOR || in->h.struct_size < KH_LAUNCH_CFG_V1_0_SIZE) {
    error = fmt::format(
        "launch called with an invalid kh_launch_cfg_t (ABI major {}, struct_size {}; this "
        "loader reads ABI major {} with struct_size >= {}): set h with "
        "KH_HEADER_INIT(kh_launch_cfg_t)",
        in->h.abi_major, in->h.struct_size, KH_ABI_MAJOR, KH_LAUNCH_CFG_V1_0_SIZE);
    return KH_ERR_INVALID_ARGUMENT;
  }
  // A writer of an older minor has a shorter struct: read only what it wrote; a newer minor's
  // extra fields are not ours to read.
  std::memcpy(&out, in, std::min<size_t>(in->h.struct_size, sizeof(out)));

  if (out.flags & ~KH_LAUNCH_FLAGS_KNOWN) {
    error = fmt::format(
        "kh_launch_cfg_t.flags 0x{:x} has bits this loader does not know (known: 0x{:x}); a "
        "launch flag changes how the kernel runs, so it is refused rather than ignored",
        out.flags, KH_LAUNCH_FLAGS_KNOWN);
    return KH_ERR_INVALID_ARGUMENT;
  }
  const uint32_t* c = out.cluster;
  if (no_cluster(out.cluster)) return KH_OK;
  // Formatted on the error paths only: a valid launch allocates nothing.
  auto dims = [&] { return fmt::format("{}x{}x{}", c[0], c[1], c[2]); };
  auto grid = [&] { return fmt::format("{}x{}x{}", out.grid[0], out.grid[1], out.grid[2]); };
  if (c[0] == 0 || c[1] == 0 || c[2] == 0) {
    error = fmt::format(
        "kh_launch_cfg_t.cluster {} has a zero dimension: use {{0,0,0}} (or {{1,1,1}}) for no "
        "cluster, else every dimension >= 1",
        dims());
    return KH_ERR_INVALID_ARGUMENT;
  }
  for (int i = 0; i < 3; ++i) {
    if (out.grid[i] % c[i] != 0) {
      error = fmt::format(
          "kh_launch_cfg_t.cluster {} does not divide the grid {} (dimension {}: "
          "{} % {} != 0); the grid must be a whole number of clusters",
          dims(), grid(), "xyz"[i], out.grid[i], c[i]);
      return KH_ERR_INVALID_ARGUMENT;
    }
  }
  const uint64_t blocks = uint64_t{c[0]} * c[1] * c[2];
  if (blocks > kMaxClusterBlocks) {
    error = fmt::format(
        "kh_launch_cfg_t.cluster {} has {} blocks; at most {} per cluster ({} portable, up to {} "
        "where the device allows non-portable sizes)",
        dims(), blocks, kMaxClusterBlocks, kPortableClusterBlocks, kMaxClusterBlocks);
    return KH_ERR_INVALID_ARGUMENT;
  }
  return KH_OK;
}

int32_t plan_launch(const kh_launch_cfg_t& cfg, int sm_major, const std::string& kernel, int device,
                    LaunchPlan& plan, std::string& error) {
  plan = LaunchPlan{};
  const bool modern = sm_major >= kClusterMinSmMajor;
  if (!no_cluster(cfg.cluster)) {
    if (!modern) {
      error = fmt::format(
          "launch of {} on CUDA device {}: a thread block cluster ({}x{}x{}) needs compute "
          "capability 9.0 or newer, and this device is sm_{}x; launch without a cluster on this "
          "device (check the sm before choosing a clustered kernel)",
          kernel, device, cfg.cluster[0], cfg.cluster[1], cfg.cluster[2], sm_major);
      return KH_ERR_LAUNCH;
    }
    plan.cluster = true;
    for (int i = 0; i < 3; ++i) plan.cluster_dims[i] = cfg.cluster[i];
    plan.non_portable_cluster =
        uint64_t{cfg.cluster[0]} * cfg.cluster[1] * cfg.cluster[2] > kPortableClusterBlocks;
  }
  plan.pdl = modern && (cfg.flags & KH_LAUNCH_PDL) != 0;
  return KH_OK;
}

}  // namespace kh
