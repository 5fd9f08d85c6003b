// Layer table semantics: fallbacks, per-mode and per-device binding, train without backward,
// strict mode, graph-capture refusal, immutability of published tables.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hub/base/error.h"
#include "hub/base/log.h"
#include "loader/layer_table.h"

namespace kh {
namespace {

int32_t fb_fwd(const kh_arg_t*, int32_t, void*) {
  return 10;
}
int32_t fb_fwd_train(const kh_arg_t*, int32_t, void*) {
  return 11;
}
int32_t fb_bwd(const kh_arg_t*, int32_t, void*) {
  return 12;
}
int32_t pk_fwd(const kh_arg_t*, int32_t, void*) {
  return 20;
}
int32_t pk_fwd_train(const kh_arg_t*, int32_t, void*) {
  return 21;
}
int32_t pk_bwd(const kh_arg_t*, int32_t, void*) {
  return 22;
}
int32_t dev1_fwd(const kh_arg_t*, int32_t, void*) {
  return 30;
}

const SlotOps kFallback{fb_fwd, fb_fwd_train, fb_bwd, KH_FLAG_HAS_BACKWARD};
const SlotOps kPackage{pk_fwd, pk_fwd_train, pk_bwd, KH_FLAG_HAS_BACKWARD | KH_FLAG_GRAPH_SAFE};
const SlotOps kNoBackward{pk_fwd, nullptr, nullptr, KH_FLAG_GRAPH_SAFE};

int32_t call(const LayerTable& t, uint32_t slot, int device = kCpuDevice) {
  return t.current()->entry(device, slot).forward(nullptr, 0, nullptr);
}

TEST(LayerTable, FallbackServesUntilBound) {
  LayerTable t;
  uint32_t s = t.add_slot("RMSNorm", kFallback);
  EXPECT_EQ(t.mode(), Mode::kEval);
  EXPECT_EQ(call(t, s), 10);
  EXPECT_TRUE(t.current()->entry(kCpuDevice, s).is_fallback);
  EXPECT_STREQ(t.current()->entry(kCpuDevice, s).source, "fallback");
  t.set_mode(Mode::kTrain);
  EXPECT_EQ(call(t, s), 11);  // the fallback's forward_train
  EXPECT_EQ(t.find_slot("RMSNorm"), static_cast<int>(s));
  EXPECT_EQ(t.find_slot("Nope"), -1);
  EXPECT_THROW(t.add_slot("RMSNorm", kFallback), Error);
}

TEST(LayerTable, EachModeHasItsOwnTable) {
  LayerTable t;
  uint32_t s = t.add_slot("RMSNorm", kFallback);
  EXPECT_EQ(t.bind(s, kCpuDevice, Mode::kEval, kPackage, "pkg 1 RMSNorm", false),
            BindOutcome::kBound);
  EXPECT_EQ(call(t, s), 20);
  t.set_mode(Mode::kTrain);
  EXPECT_EQ(call(t, s), 11) << "train was not bound: the fallback serves it";
  t.bind(s, kCpuDevice, Mode::kTrain, kPackage, "pkg 1 RMSNorm", false);
  EXPECT_EQ(call(t, s), 21);
  EXPECT_EQ(t.current()->entry(kCpuDevice, s).backward, pk_bwd);
  EXPECT_EQ(t.current()->mode, Mode::kTrain);
  t.set_mode(Mode::kEval);
  EXPECT_EQ(call(t, s), 20);
  EXPECT_STREQ(t.current()->entry(kCpuDevice, s).source, "pkg 1 RMSNorm");
}

TEST(LayerTable, TrainWithoutBackwardKeepsFallbackAndSaysWhy) {
  std::vector<std::string> lines;
  LogSink previous = set_log_sink([&](int level, const std::string& line) {
    EXPECT_EQ(level, KH_LOG_WARN);
    lines.push_back(line);
  });
  LayerTable t;
  uint32_t s = t.add_slot("SiluAndMul", kFallback);
  EXPECT_EQ(t.bind(s, kCpuDevice, Mode::kTrain, kNoBackward, "act 2 SiluAndMul", false),
            BindOutcome::kKeptFallback);
  set_log_sink(previous);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("SiluAndMul"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("no backward"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("fallback"), std::string::npos) << lines[0];
  t.set_mode(Mode::kTrain);
  EXPECT_EQ(call(t, s), 11);
  EXPECT_TRUE(t.current()->entry(kCpuDevice, s).is_fallback);
  // Eval needs no backward.
  EXPECT_EQ(t.bind(s, kCpuDevice, Mode::kEval, kNoBackward, "act 2 SiluAndMul", false),
            BindOutcome::kBound);
}

TEST(LayerTable, StrictModeRefusesTrainWithoutBackward) {
  LayerTable t;
  uint32_t s = t.add_slot("SiluAndMul", kFallback);
  try {
    t.bind(s, kCpuDevice, Mode::kTrain, kNoBackward, "act 2 SiluAndMul", true);
    FAIL() << "strict bind accepted a layer without backward";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused);
    EXPECT_NE(std::string(e.what()).find("no backward"), std::string::npos);
  }
  // A flag without a function is not enough either.
  SlotOps liar{pk_fwd, nullptr, nullptr, KH_FLAG_HAS_BACKWARD};
  EXPECT_THROW(t.bind(s, kCpuDevice, Mode::kTrain, liar, "liar", true), Error);
}

TEST(LayerTable, GraphCaptureRefusesModeSwitch) {
  LayerTable t;
  uint32_t s = t.add_slot("RMSNorm", kFallback);
  t.bind(s, kCpuDevice, Mode::kTrain, kPackage, "pkg", false);
  t.set_capturing(true);
  const Table* before = t.current();
  try {
    t.set_mode(Mode::kTrain);
    FAIL() << "set_mode switched during a capture";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused);
    EXPECT_NE(std::string(e.what()).find("graph capture"), std::string::npos);
  }
  EXPECT_EQ(t.current(), before);
  EXPECT_EQ(t.mode(), Mode::kEval);
  t.set_capturing(false);
  t.set_mode(Mode::kTrain);
  EXPECT_EQ(t.mode(), Mode::kTrain);
}

TEST(LayerTable, TablesArePerDevice) {
  LayerTable t;
  uint32_t s = t.add_slot("RMSNorm", kFallback);
  t.bind(s, 0, Mode::kEval, kPackage, "pkg sm90", false);
  t.bind(s, 1, Mode::kEval, {dev1_fwd, nullptr, nullptr, 0}, "pkg sm80", false);
  EXPECT_EQ(call(t, s, 0), 20);
  EXPECT_EQ(call(t, s, 1), 30);
  EXPECT_EQ(call(t, s, kCpuDevice), 10);
  EXPECT_EQ(call(t, s, 7), 10) << "a device without a row gets the fallback";
  EXPECT_EQ(call(t, s, -5), 10);
  EXPECT_THROW(t.bind(s, kMaxDeviceIndex + 1, Mode::kEval, kPackage, "x", false), Error);
  EXPECT_THROW(t.bind(s, -2, Mode::kEval, kPackage, "x", false), Error);
}

TEST(LayerTable, PublishedTablesAreImmutableAndKeptAlive) {
  LayerTable t;
  uint32_t s = t.add_slot("RMSNorm", kFallback);
  const Table* old = t.current();
  uint64_t old_generation = old->generation;
  t.bind(s, kCpuDevice, Mode::kEval, kPackage, "pkg", false);
  const Table* now = t.current();
  EXPECT_NE(now, old);
  EXPECT_GT(now->generation, old_generation);
  // The old table still reads as it was: a call that loaded it before the bind is safe.
  EXPECT_EQ(old->entry(kCpuDevice, s).forward(nullptr, 0, nullptr), 10);
  EXPECT_EQ(now->entry(kCpuDevice, s).forward(nullptr, 0, nullptr), 20);
  // Adding a slot keeps earlier slots and their bindings.
  uint32_t s2 = t.add_slot("Rotary", {});
  EXPECT_EQ(call(t, s), 20);
  EXPECT_EQ(t.current()->entry(kCpuDevice, s2).forward, nullptr);
  EXPECT_EQ(t.num_slots(), 2u);
  EXPECT_EQ(t.slot_name(s2), "Rotary");
}

TEST(LayerTable, SetModeIsOnePointerStoreBetweenPrebuiltTables) {
  LayerTable t;
  for (int i = 0; i < 64; ++i) t.add_slot("slot" + std::to_string(i), kFallback);
  t.set_mode(Mode::kTrain);
  const Table* train = t.current();
  t.set_mode(Mode::kEval);
  const Table* eval = t.current();
  for (int i = 0; i < 1000; ++i) {
    t.set_mode(Mode::kTrain);
    ASSERT_EQ(t.current(), train);  // no table is built on a switch
    t.set_mode(Mode::kEval);
    ASSERT_EQ(t.current(), eval);
  }
}

}  // namespace
}  // namespace kh
