#include "tools/demo/staging.h"

#include <fmt/format.h>

#include <vector>

#include "hub/base/error.h"
#include "loader/cuda_driver.h"
#include "loader/host_services.h"
#include "loader/layer_table.h"

namespace kh::demo {

namespace {

// kh_arg_t / DLTensor views of the arguments; `device_ptrs` (same length as args, null for
// non-tensors) redirects tensors to device memory.
struct ArgList {
  std::vector<DLTensor> tensors;
  std::vector<kh_arg_t> args;

  ArgList(const OpArgs& in, const std::vector<unsigned long long>* device_ptrs, int ordinal)
      : tensors(in.size()), args(in.size()) {
    for (size_t i = 0; i < in.size(); ++i) {
      const OpArg& a = in[i];
      args[i].kind = a.kind;
      if (a.kind == KH_ARG_INT) {
        args[i].v.i = a.i;
      } else if (a.kind == KH_ARG_FLOAT) {
        args[i].v.f = a.f;
      } else if (!a.t.data) {
        args[i].v.t = nullptr;  // an optional tensor left out
      } else {
        DLTensor& t = tensors[i];
        t.data = device_ptrs ? reinterpret_cast<void*>((*device_ptrs)[i]) : a.t.data;
        t.device = device_ptrs ? DLDevice{kDLCUDA, ordinal} : DLDevice{kDLCPU, 0};
        t.ndim = a.t.ndim;
        t.dtype = a.t.dtype;
        t.shape = const_cast<int64_t*>(a.t.shape);
        t.strides = nullptr;  // contiguous
        t.byte_offset = 0;
        args[i].v.t = &t;
      }
    }
  }
};

}  // namespace

SlotCaller::SlotCaller(const Runtime& runtime, int cuda_ordinal)
    : runtime_(runtime), ordinal_(cuda_ordinal) {}

SlotCaller::~SlotCaller() {
  if (buffers_.empty()) return;
  try {
    const cuda::Driver& d = cuda::cuda_driver();
    cuda::ScopedContext scope(cuda::device(ordinal_).primary_context);
    for (auto& [key, b] : buffers_) d.cuMemFree(b.ptr);
  } catch (...) {  // the process is ending the demo; the driver frees the context's memory
  }
}

bool SlotCaller::staged(uint32_t slot) const {
  if (ordinal_ < 0) return false;
  const Table* t = runtime_.table().current();
  return slot < t->num_slots && !t->entry(ordinal_, slot).is_fallback;
}

void SlotCaller::call(uint32_t slot, bool backward, const OpArgs& args) {
  if (staged(slot)) return call_staged(slot, backward, args);
  ++stats_.host_calls;
  ArgList list(args, nullptr, 0);
  const int32_t status = backward
                             ? runtime_.backward(slot, kCpuDevice, list.args.data(),
                                                 static_cast<int32_t>(list.args.size()), nullptr)
                             : runtime_.forward(slot, kCpuDevice, list.args.data(),
                                                static_cast<int32_t>(list.args.size()), nullptr);
  if (status != KH_OK)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{} {} failed (status {}): {}", runtime_.slot_name(slot),
                            backward ? "backward" : "forward", status, last_op_error()));
}

unsigned long long SlotCaller::buffer(uint32_t slot, bool backward, size_t index, size_t bytes) {
  Buffer& b = buffers_[{slot, backward, index}];
  if (b.bytes >= bytes) return b.ptr;
  const cuda::Driver& d = cuda::cuda_driver();
  if (b.ptr) {
    d.cuMemFree(b.ptr);
    stats_.device_bytes -= b.bytes;
    b = {};
  }
  cuda::check(d.cuMemAlloc(&b.ptr, bytes), fmt::format("cuMemAlloc({} bytes)", bytes));
  b.bytes = bytes;
  stats_.device_bytes += bytes;
  return b.ptr;
}

void SlotCaller::call_staged(uint32_t slot, bool backward, const OpArgs& args) {
  ++stats_.staged_calls;
  const cuda::Driver& d = cuda::cuda_driver();
  cuda::ScopedContext scope(cuda::device(ordinal_).primary_context);
  // In: inputs and in-place tensors (rotary, the CE backward); outputs are fully overwritten.
  std::vector<unsigned long long> ptrs(args.size(), 0);
  for (size_t i = 0; i < args.size(); ++i) {
    const OpArg& a = args[i];
    if (a.kind != KH_ARG_TENSOR || !a.t.data) continue;
    const size_t bytes = a.t.bytes();
    ptrs[i] = buffer(slot, backward, i, bytes == 0 ? 16 : bytes);
    if (a.t.role != Role::kIn && a.t.role != Role::kInOut) continue;
    if (bytes) cuda::check(d.cuMemcpyHtoD(ptrs[i], a.t.data, bytes), "cuMemcpyHtoD");
    stats_.bytes_to_device += bytes;
  }
  ArgList list(args, &ptrs, ordinal_);
  const int32_t status = backward
                             ? runtime_.backward(slot, ordinal_, list.args.data(),
                                                 static_cast<int32_t>(list.args.size()), nullptr)
                             : runtime_.forward(slot, ordinal_, list.args.data(),
                                                static_cast<int32_t>(list.args.size()), nullptr);
  if (status != KH_OK)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{} {} on cuda:{} failed (status {}): {}", runtime_.slot_name(slot),
                            backward ? "backward" : "forward", ordinal_, status, last_op_error()));
  // Launch errors surface here, before any result is read. The legacy default stream (nullptr)
  // orders the ops after the pageable copies above.
  cuda::check(d.cuStreamSynchronize(nullptr),
              fmt::format("cuStreamSynchronize after {} {}", runtime_.slot_name(slot),
                          backward ? "backward" : "forward"));
  for (size_t i = 0; i < args.size(); ++i) {
    const OpArg& a = args[i];
    if (a.kind != KH_ARG_TENSOR || !a.t.data) continue;
    if (a.t.role != Role::kOut && a.t.role != Role::kInOut) continue;
    const size_t bytes = a.t.bytes();
    if (bytes) cuda::check(d.cuMemcpyDtoH(a.t.data, ptrs[i], bytes), "cuMemcpyDtoH");
    stats_.bytes_to_host += bytes;
  }
}

}  // namespace kh::demo
