// The slot query of the embedding API (kernel_hub.h kh_runtime_slot_binding / slot_bound,
// kernel_hub.hpp Runtime::slot_binding / slot_bound), through libkernel_hub.so and the public
// headers only, as an embedder prints its binding table: a package layer bound in eval, the
// fallback kept in train (the layer has no backward op), another device, unknown slots and modes,
// and a caller's older (shorter) struct filled only as far as it reaches.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "kernel_hub/kernel_hub.h"
#include "kernel_hub/kernel_hub.hpp"

namespace {

std::string toy() {
  return std::string(KH_TOY_PACKAGES_DIR) + "/toy-1.0.0";
}

TEST(SlotQuery, CppNamesThePackageLayerAndItsOpsPerModeAndDevice) {
  kh::Runtime rt;
  const uint32_t s = rt.add_slot("Scale");
  const uint32_t infer = rt.add_slot("Infer");
  ASSERT_EQ(rt.bind("Scale", toy(), kh::Mode::kEval), kh::BindOutcome::kBound);
  ASSERT_EQ(rt.bind("Scale", toy(), kh::Mode::kTrain), kh::BindOutcome::kBound);
  ASSERT_EQ(rt.bind("Infer", toy(), kh::Mode::kEval, kh::kCpuDevice, "ScaleInfer"),
            kh::BindOutcome::kBound);
  ASSERT_EQ(rt.bind("Infer", toy(), kh::Mode::kTrain, kh::kCpuDevice, "ScaleInfer"),
            kh::BindOutcome::kKeptFallback);

  kh::SlotBinding eval = rt.slot_binding(s, kh::kCpuDevice, kh::Mode::kEval);
  EXPECT_TRUE(eval.bound);
  EXPECT_EQ(eval.slot, "Scale");
  EXPECT_EQ(eval.package, "toy");
  EXPECT_EQ(eval.version, "1.0.0");
  EXPECT_EQ(eval.layer, "Scale");
  EXPECT_EQ(eval.forward_op, "scale_forward");
  EXPECT_EQ(eval.backward_op, "scale_backward");
  EXPECT_EQ(eval.package_dir, toy());
  EXPECT_EQ(eval.flags & KH_FLAG_HAS_BACKWARD, KH_FLAG_HAS_BACKWARD);
  EXPECT_EQ(rt.slot_binding(s, kh::kCpuDevice, kh::Mode::kTrain).forward_op, "scale_forward_train");

  kh::SlotBinding kept = rt.slot_binding(infer, kh::kCpuDevice, kh::Mode::kTrain);
  EXPECT_FALSE(kept.bound) << "a train bind without backward keeps the fallback";
  EXPECT_EQ(kept.slot, "Infer");
  EXPECT_TRUE(kept.package.empty());
  EXPECT_EQ(rt.slot_binding(infer, kh::kCpuDevice, kh::Mode::kEval).layer, "ScaleInfer");
  EXPECT_FALSE(rt.slot_binding(s, 0, kh::Mode::kEval).bound) << "nothing bound on cuda:0";

  // slot_bound reads the published table: the current mode.
  rt.set_mode(kh::Mode::kEval);
  EXPECT_TRUE(rt.slot_bound(s, kh::kCpuDevice));
  EXPECT_TRUE(rt.slot_bound(infer, kh::kCpuDevice));
  EXPECT_FALSE(rt.slot_bound(s, 0));
  rt.set_mode(kh::Mode::kTrain);
  EXPECT_TRUE(rt.slot_bound(s, kh::kCpuDevice));
  EXPECT_FALSE(rt.slot_bound(infer, kh::kCpuDevice));
  EXPECT_FALSE(rt.slot_bound(99, kh::kCpuDevice)) << "an unknown slot is not bound";

  try {
    rt.slot_binding(99, kh::kCpuDevice, kh::Mode::kEval);
    FAIL() << "an unknown slot must throw";
  } catch (const kh::Error& e) {
    EXPECT_EQ(e.kind(), kh::ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("no layer slot 99"), std::string::npos) << e.what();
  }
}

TEST(SlotQuery, CFillsTheStructAndRefusesBadArguments) {
  kh_runtime_t* rt = kh_runtime_create(0);
  ASSERT_NE(rt, nullptr) << kh_last_error();
  uint32_t s = 0, other = 0;
  ASSERT_EQ(kh_runtime_add_slot(rt, "Scale", nullptr, nullptr, nullptr, 0, &s), KH_OK);
  ASSERT_EQ(kh_runtime_add_slot(rt, "Other", nullptr, nullptr, nullptr, 0, &other), KH_OK);
  ASSERT_EQ(
      kh_runtime_bind(rt, "Scale", toy().c_str(), nullptr, KH_MODE_EVAL, KH_DEVICE_CPU, nullptr),
      KH_OK)
      << kh_last_error();

  kh_slot_binding_t b{};
  b.struct_size = sizeof(b);
  ASSERT_EQ(kh_runtime_slot_binding(rt, s, kh_runtime_get_mode(rt), KH_DEVICE_CPU, &b), KH_OK)
      << kh_last_error();
  EXPECT_EQ(b.bound, 1);
  EXPECT_STREQ(b.slot, "Scale");
  EXPECT_STREQ(b.package, "toy");
  EXPECT_STREQ(b.version, "1.0.0");
  EXPECT_STREQ(b.layer, "Scale");
  EXPECT_STREQ(b.forward_op, "scale_forward");
  EXPECT_STREQ(b.backward_op, "scale_backward");
  EXPECT_STREQ(b.package_dir, toy().c_str());
  EXPECT_EQ(b.flags & KH_FLAG_HAS_BACKWARD, KH_FLAG_HAS_BACKWARD);
  EXPECT_EQ(kh_runtime_slot_bound(rt, s, KH_DEVICE_CPU), 1);

  kh_slot_binding_t f{};
  f.struct_size = sizeof(f);
  ASSERT_EQ(kh_runtime_slot_binding(rt, other, KH_MODE_EVAL, KH_DEVICE_CPU, &f), KH_OK);
  EXPECT_EQ(f.bound, 0);
  EXPECT_STREQ(f.slot, "Other");
  EXPECT_STREQ(f.package, "");
  EXPECT_EQ(kh_runtime_slot_bound(rt, other, KH_DEVICE_CPU), 0);
  ASSERT_EQ(kh_runtime_slot_binding(rt, s, KH_MODE_TRAIN, KH_DEVICE_CPU, &f), KH_OK);
  EXPECT_EQ(f.bound, 0) << "bound for eval only";

  // A caller built against a shorter struct: nothing past its struct_size is written.
  struct {
    kh_slot_binding_t b;
    char guard[8];
  } shorter;
  std::memset(&shorter, 0x5a, sizeof(shorter));
  shorter.b.struct_size = offsetof(kh_slot_binding_t, package);
  ASSERT_EQ(kh_runtime_slot_binding(rt, s, KH_MODE_EVAL, KH_DEVICE_CPU, &shorter.b), KH_OK);
  EXPECT_EQ(shorter.b.bound, 1);
  EXPECT_STREQ(shorter.b.slot, "Scale");
  const auto* rest = reinterpret_cast<const unsigned char*>(&shorter.b.package);
  for (size_t i = 0; i < sizeof(kh_slot_binding_t) - offsetof(kh_slot_binding_t, package); ++i)
    ASSERT_EQ(rest[i], 0x5a) << "byte " << i << " past struct_size was written";

  EXPECT_EQ(kh_runtime_slot_binding(rt, 99, KH_MODE_EVAL, KH_DEVICE_CPU, &b),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kh_last_error()).find("no layer slot 99"), std::string::npos);
  EXPECT_EQ(kh_runtime_slot_binding(rt, s, 7, KH_DEVICE_CPU, &b), KH_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kh_runtime_slot_binding(rt, s, KH_MODE_EVAL, KH_DEVICE_CPU, nullptr),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kh_runtime_slot_binding(nullptr, s, KH_MODE_EVAL, KH_DEVICE_CPU, &b),
            KH_ERR_INVALID_ARGUMENT);
  kh_slot_binding_t zero{};
  EXPECT_EQ(kh_runtime_slot_binding(rt, s, KH_MODE_EVAL, KH_DEVICE_CPU, &zero),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kh_last_error()).find("struct_size"), std::string::npos);
  EXPECT_EQ(kh_runtime_slot_bound(nullptr, s, KH_DEVICE_CPU), 0);
  kh_runtime_destroy(rt);
}

}  // namespace
