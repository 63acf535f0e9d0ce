// RWKV-4's WKV recurrence (zoo/cells/rwkv.py, wkv_recurrent) forward, for inference: one pass over time per
// batch row, every channel of a token at once. The same formula as the PyTorch loop (numerator and
// denominator scaled by e^-m, m the running maximum exponent), without its ~20 tensor ops a token. Where a
// document starts (starts, bytes [B, T], null: none) the state is the zero state again before the token.

#include "loops.h"

XLSTM_ZOO_WIDE_VECTORS

using namespace xlstm_zoo;

namespace {

// The exponent of an empty state (WKV_EMPTY_EXPONENT in backends/states.py).
constexpr float kEmptyExponent = -1e38f;

// One batch row: k, v, y [T, C]; w (= -exp(decay)), u [C]; the state num, den, m [C] updated in place; starts
// [T] or null.
__attribute__((noinline)) void wkv_row(const float* __restrict k, const float* __restrict v, const float* __restrict w,
                                       const float* __restrict u, float* __restrict y, float* __restrict num,
                                       float* __restrict den, float* __restrict m, const uint8_t* starts, int64_t T,
                                       int64_t C) {
    for (int64_t t = 0; t < T; ++t) {
        if (starts && starts[t]) {
            std::fill(num, num + C, 0.0f);
            std::fill(den, den + C, 0.0f);
            std::fill(m, m + C, kEmptyExponent);
        }
        const float* kt = k + t * C;
        const float* vt = v + t * C;
        float* yt = y + t * C;
        XLSTM_ZOO_SIMD
        for (int64_t c = 0; c < C; ++c) {
            const float key = kt[c], value = vt[c], old = m[c], bonus = u[c] + key;
            const float top = old > bonus ? old : bonus;
            float a = vexp(old - top), b = vexp(bonus - top);
            yt[c] = (a * num[c] + b * value) / (a * den[c] + b);
            const float decayed = old + w[c];
            const float next = decayed > key ? decayed : key;
            a = vexp(decayed - next);
            b = vexp(key - next);
            num[c] = a * num[c] + b * value;
            den[c] = a * den[c] + b;
            m[c] = next;
        }
    }
}

}  // namespace

extern "C" void xlstm_zoo_rwkv_wkv_forward_f32(const float* k, const float* v, const float* w, const float* u, float* y,
                                               float* num, float* den, float* m, const uint8_t* starts, int64_t B,
                                               int64_t T, int64_t C, int64_t threads) {
    over_row_blocks(B, T * C, threads, [&](int64_t first, int64_t end, int64_t) {
        for (int64_t b = first; b < end; ++b)
            wkv_row(k + b * T * C, v + b * T * C, w, u, y + b * T * C, num + b * C, den + b * C, m + b * C,
                    starts ? starts + b * T : nullptr, T, C);
    });
}
