// RWKV-4's WKV recurrence (zoo/cells/rwkv.py, wkv_recurrent), forward and backward: one pass over time per
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
// [T] or null. seen, if not null, [T, 3, C]: the state (num, den, m) each token reads, for the backward.
__attribute__((noinline)) void wkv_row(const float* __restrict k, const float* __restrict v, const float* __restrict w,
                                       const float* __restrict u, float* __restrict y, float* __restrict num,
                                       float* __restrict den, float* __restrict m, const uint8_t* starts, int64_t T,
                                       int64_t C, float* __restrict seen) {
    for (int64_t t = 0; t < T; ++t) {
        if (starts && starts[t]) {
            std::fill(num, num + C, 0.0f);
            std::fill(den, den + C, 0.0f);
            std::fill(m, m + C, kEmptyExponent);
        }
        if (seen) {
            float* at = seen + 3 * t * C;
            std::copy(num, num + C, at);
            std::copy(den, den + C, at + C);
            std::copy(m, m + C, at + 2 * C);
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

// One batch row back over time. seen [T, 3, C] from wkv_row; dy [T, C]; gn, gd, gm [C]: in, the gradient of the
// final state; out, of the initial state. dk, dv [T, C] written; dw, du [C] added to. Per token, with the state
// (n, d, m) it reads, the output y = (a n + b v) / q, q = a d + b, a = e^(m - top), b = e^(u + k - top), and the
// next state n' = a' n + b' v, d' = a' d + b', m' = max(m + w, k), a' = e^(m + w - m'), b' = e^(k - m'). The
// output does not depend on top (it cancels), so no gradient goes that way; m' does, to the larger of m + w
// and k (half each on a tie, as torch.maximum), with the gradient of n' and d' through their common scale.
// A document start cuts the gradient there: the state the token read was the zero state, not the carried one.
__attribute__((noinline)) void wkv_row_backward(const float* __restrict k, const float* __restrict v,
                                                const float* __restrict w, const float* __restrict u,
                                                const float* __restrict seen, const float* __restrict dy,
                                                const uint8_t* starts, float* __restrict gn, float* __restrict gd,
                                                float* __restrict gm, float* __restrict dk, float* __restrict dv,
                                                float* __restrict dw, float* __restrict du, int64_t T, int64_t C) {
    for (int64_t t = T - 1; t >= 0; --t) {
        const float* n = seen + 3 * t * C;
        const float* d = n + C;
        const float* m = d + C;
        const float* kt = k + t * C;
        const float* vt = v + t * C;
        const float* dyt = dy + t * C;
        float* dkt = dk + t * C;
        float* dvt = dv + t * C;
        XLSTM_ZOO_SIMD
        for (int64_t c = 0; c < C; ++c) {
            const float key = kt[c], value = vt[c], old = m[c], bonus = u[c] + key;
            // the output's part
            const float top = old > bonus ? old : bonus;
            const float a = vexp(old - top), b = vexp(bonus - top);
            const float q = a * d[c] + b, y = (a * n[c] + b * value) / q, g = dyt[c] / q;
            const float g_bonus = g * b * (value - y);  // d/d(u + k)
            // the state update's part
            const float decayed = old + w[c];
            const float next = decayed > key ? decayed : key;
            const float a2 = vexp(decayed - next), b2 = vexp(key - next);
            const float n2 = a2 * n[c] + b2 * value, d2 = a2 * d[c] + b2;
            const float via_max = gm[c] - gn[c] * n2 - gd[c] * d2;  // d/d(m'), n' and d' scaled by e^-m'
            // 1, 0 or 1/2 on a tie (written so that the loop vectorises)
            const float to_decayed = 0.5f + 0.5f * ((decayed > key ? 1.0f : 0.0f) - (decayed < key ? 1.0f : 0.0f));
            const float g_decayed = a2 * (gn[c] * n[c] + gd[c] * d[c]) + to_decayed * via_max;
            dkt[c] = g_bonus + b2 * (gn[c] * value + gd[c]) + (1.0f - to_decayed) * via_max;
            dvt[c] = g * b + gn[c] * b2;
            du[c] += g_bonus;
            dw[c] += g_decayed;
            gm[c] = g * a * (n[c] - y * d[c]) + g_decayed;
            gn[c] = g * a + gn[c] * a2;
            gd[c] = -g * a * y + gd[c] * a2;
        }
        if (starts && starts[t]) {
            std::fill(gn, gn + C, 0.0f);
            std::fill(gd, gd + C, 0.0f);
            std::fill(gm, gm + C, 0.0f);
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
                    starts ? starts + b * T : nullptr, T, C, nullptr);
    });
}

// The gradients of k, v [B, T, C], w, u [C] and the initial state num0, den0, m0 [B, C] (dnum0, dden0, dm0 null:
// not wanted) from those of y (dy) and of the final state (dnum, dden, dm; null: zero). Each row recomputes its
// forward first; w's and u's gradients are summed per block of rows, then over the blocks in order.
extern "C" void xlstm_zoo_rwkv_wkv_backward_f32(const float* k, const float* v, const float* w, const float* u,
                                                const float* num0, const float* den0, const float* m0,
                                                const uint8_t* starts, const float* dy, const float* dnum,
                                                const float* dden, const float* dm, float* dk, float* dv, float* dw,
                                                float* du, float* dnum0, float* dden0, float* dm0, int64_t B,
                                                int64_t T, int64_t C, int64_t threads) {
    std::vector<float> dw_blocks(row_blocks(B) * C, 0.0f), du_blocks(row_blocks(B) * C, 0.0f);
    over_row_blocks(B, T * C, threads, [&](int64_t first, int64_t end, int64_t block) {
        std::vector<float> seen(3 * T * C), y(T * C), state(3 * C), grad(3 * C);
        float *num = state.data(), *den = num + C, *m = den + C, *gn = grad.data(), *gd = gn + C, *gm = gd + C;
        for (int64_t b = first; b < end; ++b) {
            const int64_t row = b * T * C;
            const uint8_t* row_starts = starts ? starts + b * T : nullptr;
            std::copy(num0 + b * C, num0 + (b + 1) * C, num);
            std::copy(den0 + b * C, den0 + (b + 1) * C, den);
            std::copy(m0 + b * C, m0 + (b + 1) * C, m);
            wkv_row(k + row, v + row, w, u, y.data(), num, den, m, row_starts, T, C, seen.data());
            load_row(gn, dnum, b, C);
            load_row(gd, dden, b, C);
            load_row(gm, dm, b, C);
            wkv_row_backward(k + row, v + row, w, u, seen.data(), dy + row, row_starts, gn, gd, gm, dk + row, dv + row,
                             dw_blocks.data() + block * C, du_blocks.data() + block * C, T, C);
            if (dnum0) std::copy(gn, gn + C, dnum0 + b * C);
            if (dden0) std::copy(gd, gd + C, dden0 + b * C);
            if (dm0) std::copy(gm, gm + C, dm0 + b * C);
        }
    });
    sum_block_partials(dw_blocks, C, dw);
    sum_block_partials(du_blocks, C, du);
}
