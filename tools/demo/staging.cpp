#include "tools/demo/staging.h"

#include <fmt/format.h>

#include <vector>

namespace kh::demo {

namespace {

// kh_arg_t / DLTensor views of the arguments; `device_ptrs` (same length as args, null for
// non-tensors) redirects tensors to device memory.
struct ArgList {
  std::vector<DLTensor> tensors;
  std::vector<kh_arg_t> args;

  ArgList(const OpArgs& in, const std::vector<void*>* device_ptrs, int ordinal)
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
        t.data = device_ptrs ? (*device_ptrs)[i] : a.t.data;
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

SlotCaller::~SlotCaller() = default;

bool SlotCaller::staged(uint32_t slot) const {
  return ordinal_ >= 0 && runtime_.slot_bound(slot, ordinal_);
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

void* SlotCaller::buffer(uint32_t slot, bool backward, size_t index, size_t bytes) {
  DeviceBuffer& b = buffers_[{slot, backward, index}];
  if (b.size() >= bytes) return b.data();
  stats_.device_bytes -= b.size();
  b.reset();
  b = pool_->allocate(bytes);
  stats_.device_bytes += bytes;
  return b.data();
}

void SlotCaller::call_staged(uint32_t slot, bool backward, const OpArgs& args) {
  ++stats_.staged_calls;
  if (!pool_) {
    pool_ = std::make_unique<DevicePool>(ordinal_);
    stream_ = std::make_unique<DeviceStream>(ordinal_);
  }
  // In: inputs and in-place tensors (rotary, the CE backward); outputs are fully overwritten.
  std::vector<void*> ptrs(args.size(), nullptr);
  for (size_t i = 0; i < args.size(); ++i) {
    const OpArg& a = args[i];
    if (a.kind != KH_ARG_TENSOR || !a.t.data) continue;
    const size_t bytes = a.t.bytes();
    ptrs[i] = buffer(slot, backward, i, bytes == 0 ? 16 : bytes);
    if (a.t.role != Role::kIn && a.t.role != Role::kInOut) continue;
    if (bytes) stream_->copy(ptrs[i], a.t.data, bytes, KH_COPY_H2D);
    stats_.bytes_to_device += bytes;
  }
  ArgList list(args, &ptrs, ordinal_);
  const int32_t status =
      backward ? runtime_.backward(slot, ordinal_, list.args.data(),
                                   static_cast<int32_t>(list.args.size()), stream_->handle())
               : runtime_.forward(slot, ordinal_, list.args.data(),
                                  static_cast<int32_t>(list.args.size()), stream_->handle());
  if (status != KH_OK)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{} {} on cuda:{} failed (status {}): {}", runtime_.slot_name(slot),
                            backward ? "backward" : "forward", ordinal_, status, last_op_error()));
  // Launch errors surface here, before any result is read. The one stream orders the op after
  // the copies above.
  try {
    stream_->synchronize();
  } catch (const Error& e) {
    throw Error(e.kind(), fmt::format("{} {} on cuda:{}: {}", runtime_.slot_name(slot),
                                      backward ? "backward" : "forward", ordinal_, e.what()));
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const OpArg& a = args[i];
    if (a.kind != KH_ARG_TENSOR || !a.t.data) continue;
    if (a.t.role != Role::kOut && a.t.role != Role::kInOut) continue;
    const size_t bytes = a.t.bytes();
    if (bytes) stream_->copy(a.t.data, ptrs[i], bytes, KH_COPY_D2H);
    stats_.bytes_to_host += bytes;
  }
  stream_->synchronize();  // pageable D2H copies may return before they finish
}

}  // namespace kh::demo
