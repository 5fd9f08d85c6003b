// Op declarations (kernels/common/op_schema.h): the schema string parsed at compile time, and
// every op of every shipped package checking its arguments against its own schema through the
// real loader: a missing argument, an argument of the wrong kind and a NULL required tensor are
// refused with a message naming the op and the argument; tensor checks (dtype, shape) name the
// argument as that op's schema does (rotary_embedding_backward's dquery, not query).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/common/op_schema.h"
#include "tests/unit/test_kernels_rotary_cases.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

using khk::ArgType;
using khk::OpSchema;

constexpr OpSchema kSample{
    "sample(Tensor x, Tensor(a!)? out, int n, float eps, Tensor(b!) y, Tensor? extra) -> ()"};
static_assert(kSample.nargs() == 6);
static_assert(kSample.arg(0).type == ArgType::kTensor && !kSample.arg(0).optional &&
              !kSample.arg(0).mutated);
static_assert(kSample.arg(1).type == ArgType::kTensor && kSample.arg(1).optional &&
              kSample.arg(1).mutated);
static_assert(kSample.arg(2).type == ArgType::kInt);
static_assert(kSample.arg(3).type == ArgType::kFloat);
static_assert(kSample.arg(4).mutated && !kSample.arg(4).optional);
static_assert(kSample.arg(5).optional && !kSample.arg(5).mutated);
static_assert(kSample.index_of("eps", ArgType::kFloat, false) == 3);
static_assert(kSample.index_of("out", ArgType::kTensor, true) == 1);
static_assert(OpSchema("nothing() -> ()").nargs() == 0);

TEST(KernelsOpSchema, ParsesNamesAndKeepsTheSchemaString) {
  EXPECT_STREQ(kSample.name(), "sample");
  EXPECT_STREQ(kSample.arg(1).name, "out");
  EXPECT_STREQ(kSample.arg(5).name, "extra");
  EXPECT_STREQ(kSample.schema(),
               "sample(Tensor x, Tensor(a!)? out, int n, float eps, Tensor(b!) y, Tensor? extra) "
               "-> ()");
}

constexpr const char* kPackages[] = {"norm", "activation", "rotary", "softmax"};

// An argument of the kind `decl` wants (a tensor argument points at `t`, never read: the
// argument check fails before any tensor is looked at), or of another kind.
kh_arg_t arg_for(const khk::ArgDecl& decl, const DLTensor* t, bool wrong_kind) {
  switch (decl.type) {
    case ArgType::kTensor:
      return wrong_kind ? iarg(1) : targ(t);
    case ArgType::kInt:
      return wrong_kind ? farg(1.0) : iarg(1);
    case ArgType::kFloat:
      return wrong_kind ? targ(t) : farg(1.0);
  }
  return {};
}

// Each op's table entry: the name is the schema's, and the schema parses.
TEST(KernelsOpSchema, EveryOpIsNamedByItsSchema) {
  for (const char* p : kPackages) {
    Package pkg(p);
    ASSERT_FALSE(pkg.module().view.ops.empty()) << p;
    for (const kh_op_v1_t* op : pkg.module().view.ops) {
      const OpSchema s(op->schema);
      EXPECT_STREQ(s.name(), op->name) << p << ": " << op->schema;
    }
  }
}

TEST(KernelsOpSchema, EveryOpNamesAMissingArgument) {
  DLTensor dummy{};
  for (const char* p : kPackages) {
    Package pkg(p);
    for (const kh_op_v1_t* op : pkg.module().view.ops) {
      const OpSchema s(op->schema);
      SCOPED_TRACE(op->schema);
      std::vector<kh_arg_t> args;
      for (int i = 0; i + 1 < s.nargs(); ++i) args.push_back(arg_for(s.arg(i), &dummy, false));
      std::string err;
      EXPECT_EQ(pkg.call(op->name, args, &err), KH_ERR_INVALID_ARGUMENT);
      const khk::ArgDecl& last = s.arg(s.nargs() - 1);
      EXPECT_NE(err.find(std::string(op->name) + ": got " + std::to_string(s.nargs() - 1) +
                         " arguments, expected " + std::to_string(s.nargs())),
                std::string::npos)
          << err;
      EXPECT_NE(err.find("(" + std::string(last.name) + ") is missing"), std::string::npos) << err;
      // One too many: refused too, quoting the schema.
      args.push_back(arg_for(last, &dummy, false));
      args.push_back(iarg(0));
      EXPECT_EQ(pkg.call(op->name, args, &err), KH_ERR_INVALID_ARGUMENT);
      EXPECT_NE(err.find(op->schema), std::string::npos) << err;
    }
  }
}

TEST(KernelsOpSchema, EveryOpNamesAnArgumentOfTheWrongKindOrANullTensor) {
  DLTensor dummy{};
  for (const char* p : kPackages) {
    Package pkg(p);
    for (const kh_op_v1_t* op : pkg.module().view.ops) {
      const OpSchema s(op->schema);
      for (int bad = 0; bad < s.nargs(); ++bad) {
        SCOPED_TRACE(std::string(op->schema) + ", argument " + s.arg(bad).name);
        std::vector<kh_arg_t> args;
        for (int i = 0; i < s.nargs(); ++i) args.push_back(arg_for(s.arg(i), &dummy, i == bad));
        std::string err;
        EXPECT_EQ(pkg.call(op->name, args, &err), KH_ERR_INVALID_ARGUMENT);
        const std::string named = std::string(op->name) + ": argument " + std::to_string(bad) +
                                  " (" + s.arg(bad).name + ")";
        EXPECT_NE(err.find(named + " must be"), std::string::npos) << err;
        if (s.arg(bad).type != ArgType::kTensor || s.arg(bad).optional) continue;
        args[bad] = targ(nullptr);
        EXPECT_EQ(pkg.call(op->name, args, &err), KH_ERR_INVALID_ARGUMENT);
        EXPECT_NE(err.find(named + " is a NULL tensor"), std::string::npos) << err;
      }
    }
  }
}

TEST(KernelsOpSchema, NanFloatsAreRefusedByName) {
  Package norm("norm");
  HostTensor x(kFP32, 2, 8), y(kFP32, 2, 8), w = vector_tensor(kFP32, 8);
  std::string err;
  EXPECT_EQ(norm.call("rms_norm", {targ(x.dl()), targ(w.dl()), farg(NAN), targ(y.dl())}, &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("rms_norm: argument 2 (eps) is NaN"), std::string::npos) << err;
}

// Tensor checks name the argument as the op's own schema does.
TEST(KernelsOpSchema, WrongDtypesAndShapesNameTheArgument) {
  std::string err;
  Package norm("norm");
  HostTensor x(kBF16, 4, 32), y(kBF16, 4, 32), w = vector_tensor(kBF16, 32);
  HostTensor b32 = vector_tensor(kFP32, 32), ws(kFP32, 2, 64), dx(kBF16, 4, 32);
  HostTensor dw = vector_tensor(kBF16, 32), mean = vector_tensor(kFP32, 4),
             rstd = vector_tensor(kFP32, 4), rstd16 = vector_tensor(kBF16, 4);
  EXPECT_EQ(norm.call("layer_norm",
                      {targ(x.dl()), targ(w.dl()), targ(b32.dl()), farg(1e-5), targ(y.dl())}, &err),
            KH_ERR_UNSUPPORTED);
  EXPECT_NE(err.find("layer_norm: tensor bias is float32, expected bfloat16"), std::string::npos)
      << err;
  EXPECT_EQ(norm.call("layer_norm_backward",
                      {targ(x.dl()), targ(x.dl()), targ(w.dl()), targ(mean.dl()), targ(rstd16.dl()),
                       targ(dx.dl()), targ(dw.dl()), targ(dw.dl()), targ(ws.dl())},
                      &err),
            KH_ERR_UNSUPPORTED);
  EXPECT_NE(err.find("layer_norm_backward: tensor rstd is bfloat16, expected float32"),
            std::string::npos)
      << err;

  // rotary_embedding_backward's rotated tensors are dquery and dkey.
  Package rotary("rotary");
  HostTensor q(kBF16, 3, 2 * 8), cache(kFP32, 10, 8);
  rope_cases::HeadsDl qd(q.dl(), 2, 8, 8);
  rope_cases::CacheDl cos(cache.dl(), 4, 0, kFP32), sin(cache.dl(), 4, 4, kFP32);
  CpuExecutor cpu;
  rope_cases::Int64Tensor pos({0, 1, 2});
  const DLTensor* p = pos.view(cpu);
  EXPECT_EQ(rotary.call("rotary_embedding_backward",
                        {targ(p), targ(q.dl()), targ(nullptr), targ(&cos.t), targ(&sin.t), iarg(1)},
                        &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("rotary_embedding_backward: tensor dquery has 2 dimensions"),
            std::string::npos)
      << err;
  HostTensor k16(kFP16, 3, 2 * 8);
  rope_cases::HeadsDl kd(k16.dl(), 2, 8, 8);
  EXPECT_EQ(
      rotary.call("rotary_embedding_backward",
                  {targ(p), targ(&qd.t), targ(&kd.t), targ(&cos.t), targ(&sin.t), iarg(1)}, &err),
      KH_ERR_UNSUPPORTED);
  EXPECT_NE(err.find("tensor dkey is float16, expected bfloat16"), std::string::npos) << err;
}

}  // namespace
}  // namespace kh::kernels_test
