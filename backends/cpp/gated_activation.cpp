// The gated MLP's activation, a = silu(g) * up for u = [g, up] ([rows, 2F] -> [rows, F]), forward and
// backward in one pass each. Eagerly that is silu, a multiply and (for the gradient) silu's backward, two
// multiplies and the cat that joins the halves' gradients: six passes over tensors of several MB at a
// training step's sizes, each bound by memory bandwidth.

#include "loops.h"

XLSTM_ZOO_WIDE_VECTORS

using namespace xlstm_zoo;

namespace {

// Out of line, so that they keep this file's vector width (see XLSTM_ZOO_WIDE_VECTORS in loops.h).
__attribute__((noinline)) void gate_rows(const float* u, float* a, int64_t first, int64_t end, int64_t F) {
    for (int64_t r = first; r < end; ++r) silu_gate_row(u + r * 2 * F, u + r * 2 * F + F, a + r * F, F);
}

// du[:, :F] = da * up * silu'(g), du[:, F:] = da * silu(g); silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
__attribute__((noinline)) void gate_gradient_rows(const float* u, const float* da, float* du, int64_t first,
                                                  int64_t end, int64_t F) {
    for (int64_t r = first; r < end; ++r) {
        const float *__restrict g = u + r * 2 * F, *__restrict up = g + F, *__restrict d = da + r * F;
        float *__restrict dg = du + r * 2 * F, *__restrict dup = dg + F;
        XLSTM_ZOO_SIMD
        for (int64_t j = 0; j < F; ++j) {
            const float s = sigmoid(g[j]);
            dg[j] = d[j] * up[j] * (s * (1.0f + g[j] * (1.0f - s)));
            dup[j] = d[j] * g[j] * s;
        }
    }
}

}  // namespace

extern "C" void xlstm_zoo_silu_gate_forward_f32(const float* u, float* a, int64_t rows, int64_t F, int64_t threads) {
    over_row_blocks(rows, F, threads, [&](int64_t first, int64_t end, int64_t) { gate_rows(u, a, first, end, F); });
}

extern "C" void xlstm_zoo_silu_gate_backward_f32(const float* u, const float* da, float* du, int64_t rows, int64_t F,
                                                 int64_t threads) {
    over_row_blocks(rows, F, threads, [&](int64_t first, int64_t end, int64_t) {
        gate_gradient_rows(u, da, du, first, end, F);
    });
}
