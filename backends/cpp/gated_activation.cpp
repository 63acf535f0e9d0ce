// The gated MLP's activation, a = act(g) * up for u = [g, up] ([rows, 2F] -> [rows, F]) with act SiLU or
// GELU (exact, erf form), forward and backward in one pass each. Eagerly that is the activation, a
// multiply and (for the gradient) the activation's backward, two multiplies and the cat that joins the
// halves' gradients: six passes over tensors of several MB at a training step's sizes, each bound by
// memory bandwidth.

#include "loops.h"

XLSTM_ZOO_WIDE_VECTORS

using namespace xlstm_zoo;

namespace {

struct Silu {
    static void row(const float* g, const float* up, float* a, int64_t F) { silu_gate_row(g, up, a, F); }
    // silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
    static inline void value_and_slope(float g, float& value, float& slope) {
        const float s = sigmoid(g);
        value = g * s;
        slope = s * (1.0f + g * (1.0f - s));
    }
};

struct Gelu {
    static void row(const float* __restrict g, const float* __restrict up, float* __restrict a, int64_t F) {
        XLSTM_ZOO_SIMD
        for (int64_t j = 0; j < F; ++j) a[j] = g[j] * normal_cdf(g[j]) * up[j];
    }
    // gelu(g) = g Phi(g), gelu'(g) = Phi(g) + g phi(g).
    static inline void value_and_slope(float g, float& value, float& slope) {
        const float cdf = normal_cdf(g);
        value = g * cdf;
        slope = cdf + g * (0.3989422804f * vexp(-0.5f * g * g));  // 1 / sqrt(2 pi)
    }
};

// Out of line, so that they keep this file's vector width (see XLSTM_ZOO_WIDE_VECTORS in loops.h).
template <typename Act>
__attribute__((noinline)) void gate_rows(const float* u, float* a, int64_t first, int64_t end, int64_t F) {
    for (int64_t r = first; r < end; ++r) Act::row(u + r * 2 * F, u + r * 2 * F + F, a + r * F, F);
}

// du[:, :F] = da * up * act'(g), du[:, F:] = da * act(g).
template <typename Act>
__attribute__((noinline)) void gate_gradient_rows(const float* u, const float* da, float* du, int64_t first,
                                                  int64_t end, int64_t F) {
    for (int64_t r = first; r < end; ++r) {
        const float *__restrict g = u + r * 2 * F, *__restrict up = g + F, *__restrict d = da + r * F;
        float *__restrict dg = du + r * 2 * F, *__restrict dup = dg + F;
        XLSTM_ZOO_SIMD
        for (int64_t j = 0; j < F; ++j) {
            float value, slope;
            Act::value_and_slope(g[j], value, slope);
            dg[j] = d[j] * up[j] * slope;
            dup[j] = d[j] * value;
        }
    }
}

template <typename Act>
void forward(const float* u, float* a, int64_t rows, int64_t F, int64_t threads) {
    over_row_blocks(rows, F, threads, [&](int64_t first, int64_t end, int64_t) {
        gate_rows<Act>(u, a, first, end, F);
    });
}

template <typename Act>
void backward(const float* u, const float* da, float* du, int64_t rows, int64_t F, int64_t threads) {
    over_row_blocks(rows, F, threads, [&](int64_t first, int64_t end, int64_t) {
        gate_gradient_rows<Act>(u, da, du, first, end, F);
    });
}

}  // namespace

extern "C" void xlstm_zoo_silu_gate_forward_f32(const float* u, float* a, int64_t rows, int64_t F, int64_t threads) {
    forward<Silu>(u, a, rows, F, threads);
}

extern "C" void xlstm_zoo_silu_gate_backward_f32(const float* u, const float* da, float* du, int64_t rows, int64_t F,
                                                 int64_t threads) {
    backward<Silu>(u, da, du, rows, F, threads);
}

extern "C" void xlstm_zoo_gelu_gate_forward_f32(const float* u, float* a, int64_t rows, int64_t F, int64_t threads) {
    forward<Gelu>(u, a, rows, F, threads);
}

extern "C" void xlstm_zoo_gelu_gate_backward_f32(const float* u, const float* da, float* du, int64_t rows, int64_t F,
                                                 int64_t threads) {
    backward<Gelu>(u, da, du, rows, F, threads);
}
