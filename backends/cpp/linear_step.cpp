// A step's linear map as one call: y [M, N] = x [M, K] W^T (+ b), M up to 16 (see linear_rows.h). Where
// torch's GEMM reads W far below the memory's speed at a step's few rows (docs/performance.md).

#include "linear_rows.h"

extern "C" void xlstm_zoo_linear_step_f32(const float* x, const float* W, const float* b, float* y, int64_t M,
                                          int64_t N, int64_t K, int64_t threads) {
    using namespace xlstm_zoo;
    const Linear parts[1] = {{x, W, b, y, M, N, K}};
    linear_parts(parts, 1, threads);
}
