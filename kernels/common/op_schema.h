// Each op of a kernel package is declared once, by its schema string:
//
//   constexpr OpSchema kRmsNorm{
//       "rms_norm(Tensor x, Tensor weight, float eps, Tensor(a!) y) -> ()"};
//
// The schema is parsed at compile time (a malformed one does not compile), and everything else
// comes from it: the op table entry (name and schema string, op<body>()), the check of the
// arguments a call passes (count, kind of each, NULL only where the schema says `Tensor?`, no NaN
// floats; every message names the op and the argument), and the reads of those arguments by
// name in the op's body:
//
//   int32_t rms_norm(const Args<kRmsNorm>& a, void* stream) {
//     RowsView x;
//     KH_TRY(rows_view(a.tensor("x"), &x));  // messages name "rms_norm" and "x"
//     double eps = a.real("eps");
//     ...
//   }
//   constexpr kh_op_v1_t kOps[] = {op<rms_norm>(), ...};
//
// Argument names are resolved to indices at compile time: a name the schema lacks, or read as
// the wrong type (a.real("x"), a.tensor("key") for a `Tensor?`), does not compile. A call costs
// one pass over the declared arguments; nothing is allocated or looked up by name.
//
// Schema grammar (the subset of PyTorch's the packages use): `name(arg, ...) -> ()`, each arg
// `Type name` with Type one of `Tensor`, `Tensor(a!)` (written by the op), either with `?`
// (optional: may be a NULL tensor), `int` (KH_ARG_INT) or `float` (KH_ARG_FLOAT; an int is
// accepted and converted).
#pragma once

#include <stdint.h>

#include "kernel_hub/kernel_hub_abi.h"
#include "kernels/common/package_host.h"
#include "kernels/common/tensor_args.h"

namespace khk {

enum class ArgType : uint8_t { kTensor, kInt, kFloat };

struct ArgDecl {
  static constexpr int kMaxName = 32;
  char name[kMaxName] = {};
  ArgType type = ArgType::kTensor;
  bool optional = false;  // Tensor?: a NULL tensor is allowed
  bool mutated = false;   // Tensor(a!): the op writes it
};

// Reached only for a malformed schema or a bad argument name. Not constexpr: at compile time
// (every package declaration) the declaration or the read fails to compile, the compiler naming
// the function and the line that made the mistake; at run time (tests parsing a table's
// schemas) the process stops.
[[noreturn]] inline void op_schema_is_malformed(const char*) {
  __builtin_trap();
}
[[noreturn]] inline void op_schema_has_no_such_argument(const char*) {
  __builtin_trap();
}
[[noreturn]] inline void op_schema_declares_argument_with_another_type(const char*) {
  __builtin_trap();
}

class OpSchema {
 public:
  static constexpr int kMaxArgs = 20;
  static constexpr int kMaxName = 48;

  constexpr explicit OpSchema(const char* schema) : schema_(schema) { parse(); }

  constexpr const char* schema() const { return schema_; }
  constexpr const char* name() const { return name_; }
  constexpr int nargs() const { return nargs_; }
  constexpr const ArgDecl& arg(int i) const { return args_[i]; }

  // Index of argument `name`, which must be declared with `type` (and, for tensors, with
  // `optional` as given). Only for compile-time use (Args' name lookups).
  constexpr int index_of(const char* name, ArgType type, bool optional) const {
    for (int i = 0; i < nargs_; ++i) {
      if (!equal(args_[i].name, name)) continue;
      if (args_[i].type != type || (type == ArgType::kTensor && args_[i].optional != optional))
        op_schema_declares_argument_with_another_type(name);
      return i;
    }
    op_schema_has_no_such_argument(name);
    return -1;
  }

 private:
  static constexpr bool equal(const char* a, const char* b) {
    while (*a && *a == *b) ++a, ++b;
    return *a == *b;
  }
  static constexpr bool ident_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }
  static constexpr bool take(const char*& p, const char* word) {
    const char* q = p;
    for (; *word; ++word, ++q)
      if (*q != *word) return false;
    p = q;
    return true;
  }
  // Copies an identifier at p into out[n]; p moves past it.
  static constexpr void ident(const char*& p, char* out, int n, const char* what) {
    int len = 0;
    while (ident_char(*p)) {
      if (len + 1 >= n) op_schema_is_malformed(what);
      out[len++] = *p++;
    }
    if (len == 0) op_schema_is_malformed(what);
    out[len] = '\0';
  }
  constexpr void parse() {
    const char* p = schema_;
    ident(p, name_, kMaxName, "expected the op name (at most 47 characters) first");
    if (!take(p, "(")) op_schema_is_malformed("expected '(' after the op name");
    if (!take(p, ")")) {
      for (;;) {
        if (nargs_ == kMaxArgs) op_schema_is_malformed("more than 20 arguments");
        ArgDecl& a = args_[nargs_];
        if (take(p, "Tensor")) {
          a.type = ArgType::kTensor;
          if (take(p, "(")) {
            if (!(*p >= 'a' && *p <= 'z')) op_schema_is_malformed("expected Tensor(a!)");
            ++p;
            if (!take(p, "!)")) op_schema_is_malformed("expected Tensor(a!)");
            a.mutated = true;
          }
          a.optional = take(p, "?");
        } else if (take(p, "int")) {
          a.type = ArgType::kInt;
        } else if (take(p, "float")) {
          a.type = ArgType::kFloat;
        } else {
          op_schema_is_malformed(
              "an argument type must be Tensor, Tensor(a!), Tensor?, int or float");
        }
        if (!take(p, " ")) op_schema_is_malformed("expected a space between type and name");
        ident(p, a.name, ArgDecl::kMaxName, "expected an argument name (at most 31 characters)");
        for (int i = 0; i < nargs_; ++i)
          if (equal(args_[i].name, a.name)) op_schema_is_malformed("an argument name repeats");
        ++nargs_;
        if (take(p, ")")) break;
        if (!take(p, ", ")) op_schema_is_malformed("expected ', ' or ')' after an argument");
      }
    }
    if (!take(p, " -> ()") || *p != '\0')
      op_schema_is_malformed("ops return nothing: the schema must end with ' -> ()'");
  }

  const char* schema_;
  char name_[kMaxName] = {};
  int nargs_ = 0;
  ArgDecl args_[kMaxArgs] = {};
};

// Checks a call's arguments against `schema`: the count (a missing argument is named), each
// argument's kind, NULL tensors only where declared `Tensor?`, floats not NaN. Reports through
// host->set_error with the op's name and the argument's position and name.
int32_t check_args(const OpSchema& schema, const kh_arg_t* args, int32_t nargs);

// An op call's arguments, checked against S (check_args), read by name.
template <const OpSchema& S>
class Args {
  // A name of S's argument of type T, resolved to its index at compile time.
  template <ArgType T, bool Optional>
  struct Name {
    int index;
    consteval Name(const char* name) : index(S.index_of(name, T, Optional)) {}
  };

 public:
  explicit Args(const kh_arg_t* args) : args_(args) {}

  static constexpr const OpSchema& schema() { return S; }
  const char* op() const { return S.name(); }
  // A `Tensor` or `Tensor(a!)`: t is never NULL.
  TensorArg tensor(Name<ArgType::kTensor, false> n) const { return tensor_at(n.index); }
  // A `Tensor?` or `Tensor(a!)?`: t may be NULL.
  TensorArg optional_tensor(Name<ArgType::kTensor, true> n) const { return tensor_at(n.index); }
  int64_t integer(Name<ArgType::kInt, false> n) const { return args_[n.index].v.i; }
  // A `float`; an int argument converted.
  double real(Name<ArgType::kFloat, false> n) const {
    const kh_arg_t& a = args_[n.index];
    return a.kind == KH_ARG_FLOAT ? a.v.f : static_cast<double>(a.v.i);
  }

 private:
  TensorArg tensor_at(int i) const { return {S.name(), S.arg(i).name, args_[i].v.t}; }
  const kh_arg_t* args_;
};

// The Args type an op body `int32_t body(const Args<S>&, void* stream)` takes.
template <class Body>
struct BodyArgs;
template <const OpSchema& S>
struct BodyArgs<int32_t (*)(const Args<S>&, void*)> {
  using type = Args<S>;
};

// The kh_op_fn of `body`: checks the arguments against its schema, then runs it.
template <auto body>
int32_t call_op(const kh_arg_t* args, int32_t nargs, void* stream) {
  using A = typename BodyArgs<decltype(body)>::type;
  KH_TRY(check_args(A::schema(), args, nargs));
  return body(A(args), stream);
}

// The op table entry of `body`: name and schema string from its schema.
template <auto body>
constexpr kh_op_v1_t op(uint32_t flags = kOpFlags) {
  using A = typename BodyArgs<decltype(body)>::type;
  return {KH_HEADER_INIT(kh_op_v1_t), A::schema().name(), A::schema().schema(), flags,
          &call_op<body>};
}

// A layer without a backward op: eval only, or train with the runtime's fallback (a train bind
// keeps it: KH_FLAG_HAS_BACKWARD is not set).
constexpr kh_layer_v1_t layer(const char* name, const OpSchema& forward,
                              const OpSchema& forward_train, uint32_t flags, uint32_t dtypes) {
  return {KH_HEADER_INIT(kh_layer_v1_t), name,  forward.name(), forward_train.name(), nullptr,
          flags & ~KH_FLAG_HAS_BACKWARD, dtypes};
}

// A layer table entry naming its ops by their schemas (forward_train may be the forward op).
constexpr kh_layer_v1_t layer(const char* name, const OpSchema& forward,
                              const OpSchema& forward_train, const OpSchema& backward,
                              uint32_t flags = kLayerFlags, uint32_t dtypes = kDtypes) {
  return {KH_HEADER_INIT(kh_layer_v1_t),
          name,
          forward.name(),
          forward_train.name(),
          backward.name(),
          flags,
          dtypes};
}

}  // namespace khk
