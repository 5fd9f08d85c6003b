// Launching the softmax package's row kernels (softmax.cu) through the loader: host.cpp and
// linear_ce.cpp share it.
#pragma once

#include <stdint.h>

#include <initializer_list>

#include "kernels/common/tensor_args.h"

namespace khk {

// "bf16", "fp16" or "fp32": the dtype part of a kernel name.
const char* dtype_tag(int dtype);

// Launches `kernel_base`_<dtype>_<vec|scalar> over the rows of `shape` (all tensors in `rows`
// must allow the vector path for it to be chosen), with launch_config.h's geometry.
int32_t launch_rows(const char* op, const char* kernel_base, const RowsView& shape,
                    std::initializer_list<const RowsView*> rows, void** params, void* stream);

}  // namespace khk
