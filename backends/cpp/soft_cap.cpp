// The soft cap y = cap * tanh(x / cap) (the 7B layout's logits), forward and backward in one pass each.
// Eagerly the forward is three passes (divide, tanh, multiply) and the backward three more, over the
// logits: [tokens, vocabulary], the largest activation of a language model.

#include "loops.h"

XLSTM_ZOO_WIDE_VECTORS

using namespace xlstm_zoo;

namespace {

// Out of line, so that they keep this file's vector width (a template's lambda would not).
__attribute__((noinline)) void cap_values(const float* __restrict x, float* __restrict y, int64_t n, float cap) {
    XLSTM_ZOO_SIMD
    for (int64_t j = 0; j < n; ++j) y[j] = cap * vtanh(x[j] / cap);
}

// From the output: dx = dy (1 - (y / cap)^2).
__attribute__((noinline)) void cap_gradients(const float* __restrict y, const float* __restrict dy,
                                             float* __restrict dx, int64_t n, float cap) {
    const float inverse = 1.0f / cap;
    XLSTM_ZOO_SIMD
    for (int64_t j = 0; j < n; ++j) {
        const float t = y[j] * inverse;
        dx[j] = dy[j] * (1.0f - t * t);
    }
}

}  // namespace

extern "C" void xlstm_zoo_soft_cap_forward_f32(const float* x, float* y, int64_t rows, int64_t D, float cap,
                                               int64_t threads) {
    over_row_blocks(rows, D, threads, [&](int64_t first, int64_t end, int64_t) {
        cap_values(x + first * D, y + first * D, (end - first) * D, cap);
    });
}

extern "C" void xlstm_zoo_soft_cap_backward_f32(const float* y, const float* dy, float* dx, int64_t rows, int64_t D,
                                                float cap, int64_t threads) {
    over_row_blocks(rows, D, threads, [&](int64_t first, int64_t end, int64_t) {
        cap_gradients(y + first * D, dy + first * D, dx + first * D, (end - first) * D, cap);
    });
}
