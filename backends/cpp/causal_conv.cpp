// The conv blocks' causal depthwise convolution over time followed by SiLU, y = silu(s) with
// s[b, t, c] = bias[c] + sum_k w[c, k] xw[b, t + k, c], where xw = [state, x] along time (the state holds
// the K - 1 inputs before x). Forward and backward in one pass each (two for the backward: the input's
// gradient at t needs the pre-activation's gradient at later steps). Eagerly that is K multiply-adds of
// shifted views, a cat and the SiLU, each a pass over [B, T, C]; the backward twice as many.
//
// x is read through its row stride (the conv's input is often a half of the up-projection's output); the
// state, the output and the gradients are contiguous. Packed rows: reach [B, T] (null: none) says how many
// inputs before step t belong to its document (K - 1 or more: all the window), so tap k, which reads the
// input K - 1 - k steps back, counts only where reach >= K - 1 - k (the inputs of an earlier document are
// zeros to it, as the zero state is to a document run alone). Work is split into blocks of kSteps time steps of
// one sequence; the weight's and bias's gradients are summed per block, then over the blocks in order, so
// the result does not depend on the thread count.

#include "loops.h"

XLSTM_ZOO_WIDE_VECTORS

using namespace xlstm_zoo;

namespace {

constexpr int64_t kSteps = 64;

struct Conv {
    const float *x, *state, *bias;
    const float* taps;  // w transposed to [K, C], so that the loops over channels read it contiguously
    int64_t x_stride, B, T, C, K;
    const int32_t* reach;  // [B, T] or null

    int64_t time_blocks() const { return (T + kSteps - 1) / kSteps; }
    // The first tap that step t of sequence b reads (0 unless a document starts within its window).
    int64_t first_tap(int64_t b, int64_t t) const { return reach ? std::max<int64_t>(0, K - 1 - reach[b * T + t]) : 0; }
    // Row i of xw for sequence b: in the state for i < K - 1, else in x.
    const float* window_row(int64_t b, int64_t i) const {
        return i < K - 1 ? state + (b * (K - 1) + i) * C : x + (b * T + i - (K - 1)) * x_stride;
    }
};

std::vector<float> transposed_taps(const float* w, int64_t C, int64_t K) {
    std::vector<float> wt(K * C);
    for (int64_t c = 0; c < C; ++c)
        for (int64_t k = 0; k < K; ++k) wt[k * C + c] = w[c * K + k];
    return wt;
}

// The step functions below are out of line, defined after XLSTM_ZOO_WIDE_VECTORS, so that their loops get
// 512-bit vectors (loops inside the lambdas handed to parallel_rows would not; see loops.h): at the
// quick cells' sizes (C=64) the 256-bit exp made the forward cost ~1.1 ns a value.

// s for step t of sequence b, into s[C].
__attribute__((noinline)) void preactivation(const Conv& p, int64_t b, int64_t t, float* __restrict s) {
    std::copy(p.bias, p.bias + p.C, s);
    for (int64_t k = p.first_tap(b, t); k < p.K; ++k) {
        const float *__restrict row = p.window_row(b, t + k), *__restrict tap = p.taps + k * p.C;
        XLSTM_ZOO_SIMD
        for (int64_t c = 0; c < p.C; ++c) s[c] += tap[c] * row[c];
    }
}

__attribute__((noinline)) void forward_steps(const Conv& p, int64_t b, int64_t first, int64_t end, float* __restrict s,
                                             float* y) {
    for (int64_t t = first; t < end; ++t) {
        preactivation(p, b, t, s);
        float* __restrict yr = y + (b * p.T + t) * p.C;
        XLSTM_ZOO_SIMD
        for (int64_t c = 0; c < p.C; ++c) yr[c] = s[c] * sigmoid(s[c]);
    }
}

// ds = dy silu'(s) (s recomputed) into ds; the block's partial weight (transposed) and bias gradients.
__attribute__((noinline)) void gradient_steps(const Conv& p, int64_t b, int64_t first, int64_t end,
                                              float* __restrict s, const float* dy, float* ds, float* __restrict dwt,
                                              float* __restrict dbias) {
    const int64_t C = p.C;
    for (int64_t t = first; t < end; ++t) {
        preactivation(p, b, t, s);
        const float* __restrict dyr = dy + (b * p.T + t) * C;
        float* __restrict dsr = ds + (b * p.T + t) * C;
        XLSTM_ZOO_SIMD
        for (int64_t c = 0; c < C; ++c) {
            const float sig = sigmoid(s[c]);
            dsr[c] = dyr[c] * sig * (1.0f + s[c] * (1.0f - sig));
        }
        XLSTM_ZOO_SIMD
        for (int64_t c = 0; c < C; ++c) dbias[c] += dsr[c];
        for (int64_t k = p.first_tap(b, t); k < p.K; ++k) {
            const float* __restrict row = p.window_row(b, t + k);
            float* __restrict dtap = dwt + k * C;
            XLSTM_ZOO_SIMD
            for (int64_t c = 0; c < C; ++c) dtap[c] += dsr[c] * row[c];
        }
    }
}

// dxw row i (i = K - 1 + t for x's step t, i < K - 1 for the state's rows) = sum_k w[k] ds[i - k] over the
// steps i - k in [0, T) whose tap k reads it.
__attribute__((noinline)) void input_gradient_row(const Conv& p, const float* ds, int64_t b, int64_t i,
                                                  float* __restrict out) {
    std::fill(out, out + p.C, 0.0f);
    for (int64_t k = std::max<int64_t>(0, i - (p.T - 1)); k <= std::min(i, p.K - 1); ++k) {
        if (k < p.first_tap(b, i - k)) continue;
        const float *__restrict dsr = ds + (b * p.T + i - k) * p.C, *__restrict tap = p.taps + k * p.C;
        XLSTM_ZOO_SIMD
        for (int64_t c = 0; c < p.C; ++c) out[c] += tap[c] * dsr[c];
    }
}

// body(block, b, first, end, s) over blocks of kSteps steps of one sequence, s a per-thread row of C.
template <typename Body>
void over_blocks(const Conv& p, int64_t threads, const Body& body) {
    if (p.B * p.T * p.C < kMinElementsForThreads) threads = 1;
    parallel_rows(p.B * p.time_blocks(), threads, [&]() {
        return [&, s = std::vector<float>(p.C)](int64_t block) mutable {
            const int64_t b = block / p.time_blocks(), t0 = block % p.time_blocks() * kSteps;
            body(block, b, t0, std::min(p.T, t0 + kSteps), s.data());
        };
    });
}

}  // namespace

extern "C" void xlstm_zoo_causal_conv_silu_forward_f32(const float* x, int64_t x_stride, const float* state,
                                                       const float* w, const float* bias, const int32_t* reach,
                                                       float* y, int64_t B, int64_t T, int64_t C, int64_t K,
                                                       int64_t threads) {
    const std::vector<float> wt = transposed_taps(w, C, K);
    const Conv p{x, state, bias, wt.data(), x_stride, B, T, C, K, reach};
    over_blocks(p, threads, [&](int64_t, int64_t b, int64_t first, int64_t end, float* s) {
        forward_steps(p, b, first, end, s, y);
    });
}

// ds [B, T, C] is scratch; dx is dxw's last T rows, dstate (optional: null) its first K - 1.
extern "C" void xlstm_zoo_causal_conv_silu_backward_f32(const float* x, int64_t x_stride, const float* state,
                                                        const float* w, const float* bias, const int32_t* reach,
                                                        const float* dy, float* ds, float* dx, float* dstate,
                                                        float* dw, float* db, int64_t B, int64_t T, int64_t C,
                                                        int64_t K, int64_t threads) {
    const std::vector<float> wt = transposed_taps(w, C, K);
    const Conv p{x, state, bias, wt.data(), x_stride, B, T, C, K, reach};
    const int64_t blocks = B * p.time_blocks();
    std::vector<float> dwt_blocks(blocks * K * C, 0.0f), db_blocks(blocks * C, 0.0f);
    over_blocks(p, threads, [&](int64_t block, int64_t b, int64_t first, int64_t end, float* s) {
        gradient_steps(p, b, first, end, s, dy, ds, dwt_blocks.data() + block * K * C, db_blocks.data() + block * C);
    });
    over_blocks(p, threads, [&](int64_t, int64_t b, int64_t first, int64_t end, float*) {
        for (int64_t t = first; t < end; ++t) input_gradient_row(p, ds, b, K - 1 + t, dx + (b * T + t) * C);
        if (dstate && first == 0)
            for (int64_t i = 0; i < K - 1; ++i) input_gradient_row(p, ds, b, i, dstate + (b * (K - 1) + i) * C);
    });
    std::vector<float> dwt(K * C);
    sum_block_partials(dwt_blocks, K * C, dwt.data());
    for (int64_t c = 0; c < C; ++c)
        for (int64_t k = 0; k < K; ++k) dw[c * K + k] = dwt[k * C + c];
    sum_block_partials(db_blocks, C, db);
}
