// RMSNorm over the last axis, y = x * r * w (+ b) with r = 1 / sqrt(mean(x^2) + eps) per row of [rows, D],
// forward and backward in one pass over the rows each. Eagerly the forward is five ops (square, mean, add,
// rsqrt, two multiplies) and the backward twice that, each a pass over the activations; at a training
// step's sizes every pass is bound by memory bandwidth.

#include "loops.h"

XLSTM_ZOO_WIDE_VECTORS

using namespace xlstm_zoo;

// r (one per row) is kept for the backward.
extern "C" void xlstm_zoo_rms_norm_forward_f32(const float* x, const float* w, const float* b, float* y, float* r,
                                               int64_t rows, int64_t D, float eps, int64_t threads) {
    over_row_blocks(rows, D, threads, [&](int64_t first, int64_t end, int64_t) {
        for (int64_t row = first; row < end; ++row) {
            const float* __restrict xr = x + row * D;
            float* __restrict yr = y + row * D;
            float squares = 0.0f;
            XLSTM_ZOO_SIMD_REDUCE(+ : squares)
            for (int64_t j = 0; j < D; ++j) squares += xr[j] * xr[j];
            const float scale = 1.0f / std::sqrt(squares / float(D) + eps);
            r[row] = scale;
            if (b) {
                XLSTM_ZOO_SIMD
                for (int64_t j = 0; j < D; ++j) yr[j] = xr[j] * scale * w[j] + b[j];
            } else {
                XLSTM_ZOO_SIMD
                for (int64_t j = 0; j < D; ++j) yr[j] = xr[j] * scale * w[j];
            }
        }
    });
}

// With n = x r and g = dy w: dx = r (g - n mean(g n)), dw = sum over rows of dy n, db = sum of dy. The
// weight's (and bias's) gradient is summed per block of rows, then over the blocks in order, so it does
// not depend on how the blocks fell to threads.
extern "C" void xlstm_zoo_rms_norm_backward_f32(const float* x, const float* w, const float* r, const float* dy,
                                                float* dx, float* dw, float* db, int64_t rows, int64_t D,
                                                int64_t threads) {
    const int64_t blocks = row_blocks(rows);
    std::vector<float> dw_blocks(blocks * D, 0.0f), db_blocks(db ? blocks * D : 0, 0.0f);
    over_row_blocks(rows, D, threads, [&](int64_t first, int64_t end, int64_t block) {
        float* __restrict dw_block = dw_blocks.data() + block * D;
        float* __restrict db_block = db ? db_blocks.data() + block * D : nullptr;
        for (int64_t row = first; row < end; ++row) {
            const float *__restrict xr = x + row * D, *__restrict dyr = dy + row * D;
            float* __restrict dxr = dx + row * D;
            const float scale = r[row];
            float dot = 0.0f;  // sum over j of g n
            XLSTM_ZOO_SIMD_REDUCE(+ : dot)
            for (int64_t j = 0; j < D; ++j) dot += dyr[j] * w[j] * xr[j];
            const float mean_gn = dot * scale / float(D);
            XLSTM_ZOO_SIMD
            for (int64_t j = 0; j < D; ++j) {
                const float n = xr[j] * scale;
                dxr[j] = scale * (dyr[j] * w[j] - n * mean_gn);
                dw_block[j] += dyr[j] * n;
            }
            if (db_block) {
                XLSTM_ZOO_SIMD
                for (int64_t j = 0; j < D; ++j) db_block[j] += dyr[j];
            }
        }
    });
    sum_block_partials(dw_blocks, D, dw);
    if (db) sum_block_partials(db_blocks, D, db);
}
