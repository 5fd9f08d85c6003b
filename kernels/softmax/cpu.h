// cpu implementation of the softmax package: fp32 math with the online-softmax merge of
// softmax_math.h, results rounded to the storage dtype. Strides in elements.
#pragma once

#include <stdint.h>

namespace khk::softmax_cpu {

// y = softmax(x) over each row of `cols`.
void forward(int dtype, const void* x, int64_t sx, void* y, int64_t sy, int64_t rows, int64_t cols);
// dx = y * (dy - sum(dy * y)).
void backward(int dtype, const void* dy, int64_t sdy, const void* y, int64_t sy, void* dx,
              int64_t sdx, int64_t rows, int64_t cols);
// loss[r] = logsumexp(x[r]) - x[r, target[r]] (0 when target == ignore_index, NaN when the target
// is outside [0, cols)); when dx is not NULL also dx = (softmax - onehot) * scale, zero rows for
// ignored tokens.
void ce_forward(int dtype, const void* x, int64_t sx, const int64_t* targets, int64_t ignore_index,
                float* loss, void* dx, int64_t sdx, float scale, int64_t rows, int64_t cols);
// dx[r, :] *= dloss[r].
void ce_backward(int dtype, const float* dloss, void* dx, int64_t sdx, int64_t rows, int64_t cols);

// x[r, :] *= factor over `rows` rows of `cols` (zero: x = 0, whatever x held, NaN included).
void scale_rows(int dtype, void* x, int64_t sx, int64_t rows, int64_t cols, float factor,
                bool zero);

}  // namespace khk::softmax_cpu
