#include "kernels/common/op_schema.h"

namespace khk {

namespace {

const char* kind_text(int32_t kind) {
  switch (kind) {
    case KH_ARG_TENSOR:
      return "a tensor";
    case KH_ARG_INT:
      return "an int";
    case KH_ARG_FLOAT:
      return "a float";
    case KH_ARG_DTYPE:
      return "a dtype";
    default:
      return "an unknown kind";
  }
}

int32_t want_kind(ArgType type) {
  return type == ArgType::kTensor ? KH_ARG_TENSOR
         : type == ArgType::kInt  ? KH_ARG_INT
                                  : KH_ARG_FLOAT;
}

}  // namespace

int32_t check_args(const OpSchema& s, const kh_arg_t* args, int32_t nargs) {
  const char* op = s.name();
  if (nargs < 0 || (!args && nargs != 0))
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: args is NULL or nargs is negative (%d)", op, nargs);
  if (nargs < s.nargs())
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: got %d arguments, expected %d: argument %d (%s) is missing; the schema is %s",
                op, nargs, s.nargs(), nargs, s.arg(nargs).name, s.schema());
  if (nargs > s.nargs())
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: got %d arguments, expected %d; the schema is %s", op,
                nargs, s.nargs(), s.schema());
  for (int32_t i = 0; i < nargs; ++i) {
    const ArgDecl& d = s.arg(i);
    const kh_arg_t& a = args[i];
    const int32_t want = want_kind(d.type);
    // A float argument takes an int too (Python passes 1 for 1.0).
    const bool kind_ok = a.kind == want || (d.type == ArgType::kFloat && a.kind == KH_ARG_INT);
    if (!kind_ok)
      return fail(KH_ERR_INVALID_ARGUMENT,
                  "%s: argument %d (%s) must be %s (kind %d), got %s (kind %d)", op, i, d.name,
                  kind_text(want), want, kind_text(a.kind), a.kind);
    if (d.type == ArgType::kTensor && !a.v.t && !d.optional)
      return fail(KH_ERR_INVALID_ARGUMENT,
                  "%s: argument %d (%s) is a NULL tensor; only arguments declared Tensor? may be "
                  "NULL",
                  op, i, d.name);
    if (a.kind == KH_ARG_FLOAT && !(a.v.f == a.v.f))
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: argument %d (%s) is NaN", op, i, d.name);
  }
  return KH_OK;
}

}  // namespace khk
