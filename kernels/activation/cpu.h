// cpu implementation of the activation package: fp32 math with the same formulas as the device
// code (act_math.h), results rounded to the storage dtype. Strides in elements.
#pragma once

#include <stdint.h>

namespace khk::act_cpu {

// Forward: y = act(gate) * up for GLU ops (x holds [gate | up], 2 * d per row), y = act(x)
// otherwise. Backward: dx from dy and x (dx shaped like x); for GLU ops with y non-null, also the
// forward's output into y (row stride sy) in the same pass.
void forward(int op, int dtype, const void* x, int64_t sx, void* y, int64_t sy, int64_t rows,
             int64_t d);
void backward(int op, int dtype, const void* dy, int64_t sdy, const void* x, int64_t sx, void* dx,
              int64_t sdx, int64_t rows, int64_t d, void* y = nullptr, int64_t sy = 0);

}  // namespace khk::act_cpu
