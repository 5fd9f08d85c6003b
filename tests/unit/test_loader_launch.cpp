// The launch configuration of host->launch (loader/launch_config.h), without a GPU: a cfg is
// read by its writer's struct_size (an ABI 1.0 package's shorter cfg still launches the plain
// way, whatever lies past its end), cluster dims and flags are checked before a driver sees
// them, and the plan says cuLaunchKernelEx only for a cluster or PDL on sm_90+.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "loader/host_services.h"
#include "loader/launch_config.h"
#include "loader/loaded_package.h"

namespace kh {
namespace {

kh_launch_cfg_t cfg_with(uint32_t gx, uint32_t gy, uint32_t gz, uint32_t cx, uint32_t cy,
                         uint32_t cz, uint32_t flags = 0) {
  kh_launch_cfg_t c = {};
  c.h = KH_HEADER_INIT(kh_launch_cfg_t);
  c.grid[0] = gx;
  c.grid[1] = gy;
  c.grid[2] = gz;
  c.block[0] = c.block[1] = c.block[2] = 1;
  c.cluster[0] = cx;
  c.cluster[1] = cy;
  c.cluster[2] = cz;
  c.flags = flags;
  return c;
}

// read_launch_cfg's status and message for `in`.
std::pair<int32_t, std::string> read(const kh_launch_cfg_t& in, kh_launch_cfg_t* out = nullptr) {
  kh_launch_cfg_t tmp;
  std::string error;
  int32_t s = read_launch_cfg(&in, out ? *out : tmp, error);
  return {s, error};
}

TEST(LaunchCfg, AnAbi10CfgReadsTheNewFieldsAsZero) {
  // An ABI 1.0 writer's 40 bytes, followed by memory that is not the writer's (poisoned).
  std::vector<unsigned char> bytes(sizeof(kh_launch_cfg_t) + 16, 0xAB);
  kh_launch_cfg_t v10 = cfg_with(8, 2, 1, 0, 0, 0);
  v10.h.struct_size = KH_LAUNCH_CFG_V1_0_SIZE;
  v10.h.abi_minor = 0;
  v10.shared_mem_bytes = 4096;
  v10.device_id = 3;
  std::memcpy(bytes.data(), &v10, KH_LAUNCH_CFG_V1_0_SIZE);
  kh_launch_cfg_t out;
  std::string error;
  ASSERT_EQ(read_launch_cfg(reinterpret_cast<const kh_launch_cfg_t*>(bytes.data()), out, error),
            KH_OK)
      << error;
  EXPECT_EQ(out.grid[0], 8u);
  EXPECT_EQ(out.grid[1], 2u);
  EXPECT_EQ(out.shared_mem_bytes, 4096u);
  EXPECT_EQ(out.device_id, 3);
  EXPECT_EQ(out.cluster[0], 0u);
  EXPECT_EQ(out.cluster[1], 0u);
  EXPECT_EQ(out.cluster[2], 0u);
  EXPECT_EQ(out.flags, 0u);
  LaunchPlan plan;
  ASSERT_EQ(plan_launch(out, 9, "k", 0, plan, error), KH_OK) << error;
  EXPECT_FALSE(plan.extended()) << "an ABI 1.0 cfg launches with cuLaunchKernel";
}

TEST(LaunchCfg, ANewerMinorsLargerCfgIsReadAsFarAsThisLoaderKnows) {
  std::vector<unsigned char> bytes(sizeof(kh_launch_cfg_t) + 16, 0);
  kh_launch_cfg_t c = cfg_with(4, 1, 1, 2, 1, 1, KH_LAUNCH_PDL);
  c.h.struct_size = sizeof(kh_launch_cfg_t) + 16;  // a field of ABI 1.2, unknown here
  c.h.abi_minor = KH_ABI_MINOR + 1;
  std::memcpy(bytes.data(), &c, sizeof c);
  std::memset(bytes.data() + sizeof c, 0x5A, 16);
  kh_launch_cfg_t out;
  std::string error;
  ASSERT_EQ(read_launch_cfg(reinterpret_cast<const kh_launch_cfg_t*>(bytes.data()), out, error),
            KH_OK)
      << error;
  EXPECT_EQ(out.cluster[0], 2u);
  EXPECT_EQ(out.flags, KH_LAUNCH_PDL);
}

TEST(LaunchCfg, HeadersItCannotReadAreRefused) {
  kh_launch_cfg_t c = cfg_with(1, 1, 1, 0, 0, 0);
  c.h.struct_size = KH_LAUNCH_CFG_V1_0_SIZE - 4;
  auto [s, e] = read(c);
  EXPECT_EQ(s, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e.find("struct_size 36"), std::string::npos) << e;
  EXPECT_NE(e.find("KH_HEADER_INIT(kh_launch_cfg_t)"), std::string::npos) << e;
  c = cfg_with(1, 1, 1, 0, 0, 0);
  c.h.abi_major = KH_ABI_MAJOR + 1;
  EXPECT_EQ(read(c).first, KH_ERR_INVALID_ARGUMENT);
  kh_launch_cfg_t out;
  std::string error;
  EXPECT_EQ(read_launch_cfg(nullptr, out, error), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("null"), std::string::npos) << error;
}

TEST(LaunchCfg, ClusterDimsAreChecked) {
  EXPECT_EQ(read(cfg_with(8, 4, 2, 0, 0, 0)).first, KH_OK);    // no cluster
  EXPECT_EQ(read(cfg_with(7, 3, 1, 1, 1, 1)).first, KH_OK);    // a cluster of one: none
  EXPECT_EQ(read(cfg_with(8, 4, 2, 2, 2, 2)).first, KH_OK);    // 8 blocks, portable
  EXPECT_EQ(read(cfg_with(32, 1, 1, 16, 1, 1)).first, KH_OK);  // 16: non-portable, allowed
  auto [s1, e1] = read(cfg_with(6, 1, 1, 4, 1, 1));
  EXPECT_EQ(s1, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e1.find("cluster 4x1x1 does not divide the grid 6x1x1"), std::string::npos) << e1;
  EXPECT_NE(e1.find("dimension x"), std::string::npos) << e1;
  auto [s2, e2] = read(cfg_with(8, 6, 1, 2, 4, 1));
  EXPECT_EQ(s2, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e2.find("dimension y: 6 % 4"), std::string::npos) << e2;
  auto [s3, e3] = read(cfg_with(32, 2, 1, 16, 2, 1));
  EXPECT_EQ(s3, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e3.find("32 blocks; at most 16"), std::string::npos) << e3;
  auto [s4, e4] = read(cfg_with(8, 1, 1, 2, 0, 1));
  EXPECT_EQ(s4, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e4.find("zero dimension"), std::string::npos) << e4;
}

TEST(LaunchCfg, UnknownFlagsAreRefusedNotIgnored) {
  auto [s, e] = read(cfg_with(1, 1, 1, 0, 0, 0, 0x4u | KH_LAUNCH_PDL));
  EXPECT_EQ(s, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e.find("flags 0x5"), std::string::npos) << e;
  EXPECT_EQ(read(cfg_with(1, 1, 1, 0, 0, 0, KH_LAUNCH_PDL)).first, KH_OK);
}

TEST(LaunchCfg, PlanByComputeCapability) {
  std::string error;
  LaunchPlan plan;
  // sm_90: a cluster and PDL go to cuLaunchKernelEx.
  ASSERT_EQ(plan_launch(cfg_with(8, 1, 1, 2, 1, 1), 9, "k", 0, plan, error), KH_OK) << error;
  EXPECT_TRUE(plan.extended());
  EXPECT_TRUE(plan.cluster);
  EXPECT_FALSE(plan.non_portable_cluster);
  EXPECT_EQ(plan.cluster_dims[0], 2u);
  EXPECT_FALSE(plan.pdl);
  ASSERT_EQ(plan_launch(cfg_with(32, 1, 1, 16, 1, 1), 10, "k", 0, plan, error), KH_OK);
  EXPECT_TRUE(plan.non_portable_cluster);
  ASSERT_EQ(plan_launch(cfg_with(4, 1, 1, 1, 1, 1, KH_LAUNCH_PDL), 9, "k", 0, plan, error), KH_OK);
  EXPECT_TRUE(plan.pdl);
  EXPECT_FALSE(plan.cluster);
  EXPECT_TRUE(plan.extended());
  // sm_80: PDL falls back to stream order (still correct); a cluster is refused, naming the
  // kernel, the device and what it needs.
  ASSERT_EQ(plan_launch(cfg_with(4, 1, 1, 0, 0, 0, KH_LAUNCH_PDL), 8, "k", 0, plan, error), KH_OK);
  EXPECT_FALSE(plan.pdl);
  EXPECT_FALSE(plan.extended());
  EXPECT_EQ(plan_launch(cfg_with(8, 1, 1, 2, 1, 1), 8, "attn_fwd", 1, plan, error), KH_ERR_LAUNCH);
  EXPECT_NE(error.find("launch of attn_fwd on CUDA device 1"), std::string::npos) << error;
  EXPECT_NE(error.find("compute capability 9.0"), std::string::npos) << error;
  EXPECT_NE(error.find("sm_8x"), std::string::npos) << error;
  // A cluster of one block is no cluster, on any device.
  ASSERT_EQ(plan_launch(cfg_with(8, 1, 1, 1, 1, 1), 7, "k", 0, plan, error), KH_OK) << error;
  EXPECT_FALSE(plan.extended());
}

// Through a package's host table: what the backend receives from the toy package (an ABI 1.0
// writer: its cfg is 40 bytes) and what a malformed cfg gets back.
class CfgRecorder : public DeviceBackend {
 public:
  int32_t get_function(const PackageIdentity&, int32_t, const char*, void** fn,
                       std::string&) override {
    *fn = this;
    return KH_OK;
  }
  int32_t launch(const PackageIdentity&, void*, const kh_launch_cfg_t& c, void**, void*,
                 std::string&) override {
    cfg = c;
    ++launches;
    return KH_OK;
  }
  kh_launch_cfg_t cfg{};
  int launches = 0;
};

TEST(LaunchCfg, TheHostTableHandsBackendsAWholeCfg) {
  const LoadedPackage p = load_package(std::string(KH_TOY_PACKAGES_DIR) + "/toy-1.0.0");
  const kh_op_v1_t* op = p.module->view.find_op("scale_forward");
  ASSERT_NE(op, nullptr);
  CfgRecorder backend;
  set_device_backend(&backend);
  std::vector<float> values(300, 1.0f);
  int64_t shape[1] = {300};
  DLTensor x{};
  x.data = values.data();  // never dereferenced: the recorder launches nothing
  x.device = {kDLCUDA, 0};
  x.ndim = 1;
  x.dtype = {kDLFloat, 32, 1};
  x.shape = shape;
  kh_arg_t args[3];
  args[0].kind = KH_ARG_TENSOR;
  args[0].v.t = &x;
  args[1].kind = KH_ARG_FLOAT;
  args[1].v.f = 2.0;
  args[2].kind = KH_ARG_TENSOR;
  args[2].v.t = &x;
  const int32_t status = op->call(args, 3, nullptr);

  // A malformed cfg never reaches the backend; the message names the package.
  const kh_host_v1_t& host = p.module->host->table;
  kh_launch_cfg_t bad = cfg_with(6, 1, 1, 4, 1, 1);
  const int32_t bad_status = host.launch(host.ctx, &backend, &bad, nullptr, nullptr);
  const std::string bad_error = last_op_error();
  set_device_backend(nullptr);

  ASSERT_EQ(status, KH_OK) << last_op_error();
  ASSERT_EQ(backend.launches, 1);
  EXPECT_EQ(backend.cfg.h.struct_size, KH_LAUNCH_CFG_V1_0_SIZE) << "the toy writes ABI 1.0's cfg";
  EXPECT_EQ(backend.cfg.grid[0], 2u);
  EXPECT_EQ(backend.cfg.block[0], 256u);
  EXPECT_EQ(backend.cfg.cluster[0], 0u);
  EXPECT_EQ(backend.cfg.cluster[1], 0u);
  EXPECT_EQ(backend.cfg.cluster[2], 0u);
  EXPECT_EQ(backend.cfg.flags, 0u);
  EXPECT_EQ(bad_status, KH_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(backend.launches, 1);
  EXPECT_NE(bad_error.find("toy 1.0.0"), std::string::npos) << bad_error;
  EXPECT_NE(bad_error.find("does not divide the grid"), std::string::npos) << bad_error;
}

}  // namespace
}  // namespace kh
