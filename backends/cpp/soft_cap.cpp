// The soft cap y = cap * tanh(x / cap) (the 7B layout's logits), forward and backward in one pass each.
// Eagerly the forward is three passes (divide, tanh, multiply) and the backward three more, over the
// logits: [tokens, vocabulary], the largest activation of a language model.

#include "loops.h"

using namespace xlstm_zoo;

extern "C" void xlstm_zoo_soft_cap_forward_f32(const float* x, float* y, int64_t rows, int64_t D, float cap,
                                               int64_t threads) {
    over_row_blocks(rows, D, threads, [&](int64_t first, int64_t end, int64_t) {
        const float* __restrict in = x + first * D;
        float* __restrict out = y + first * D;
        XLSTM_ZOO_SIMD
        for (int64_t j = 0; j < (end - first) * D; ++j) out[j] = cap * vtanh(in[j] / cap);
    });
}

// From the output: dx = dy (1 - (y / cap)^2).
extern "C" void xlstm_zoo_soft_cap_backward_f32(const float* y, const float* dy, float* dx, int64_t rows, int64_t D,
                                                float cap, int64_t threads) {
    const float inverse = 1.0f / cap;
    over_row_blocks(rows, D, threads, [&](int64_t first, int64_t end, int64_t) {
        const float *__restrict out = y + first * D, *__restrict d = dy + first * D;
        float* __restrict dxr = dx + first * D;
        XLSTM_ZOO_SIMD
        for (int64_t j = 0; j < (end - first) * D; ++j) {
            const float t = out[j] * inverse;
            dxr[j] = d[j] * (1.0f - t * t);
        }
    });
}
