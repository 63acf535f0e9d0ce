// The per-head LayerNorm, y = (LayerNorm per head of h) * w (+ b), times sigmoid(o) for the 7B-layout mLSTM
// cell's output, without a gate for the conv blocks' cell norm; forward and backward in one pass each.
// For the 7B cell h arrives head-major from the mLSTM ([B, H, T, D]) and y leaves token-major
// ([B, T, H*D]), so the pass also does the layout change; the cell norm reads h token-major. Eagerly that
// is a copy, layer_norm, the scale, sigmoid and the product forward and about twice as many passes
// backward, each bound by memory bandwidth.
//
// Rows are tokens (b, t); a row reads its H head vectors of D features from h. mean and rstd (one per
// token and head, [B*T, H]) are kept for the backward.

#include "loops.h"

XLSTM_ZOO_WIDE_VECTORS

using namespace xlstm_zoo;

namespace {

template <bool head_major>
struct Layout {
    int64_t T, H, D;
    // the start of head `head` of token `row` = (b, t) in h, [B, H, T, D] or [B, T, H*D]
    int64_t head_offset(int64_t row, int64_t head) const {
        if (!head_major) return (row * H + head) * D;
        const int64_t b = row / T, t = row % T;
        return ((b * H + head) * T + t) * D;
    }
};

// Gated (o not null): the 7B cell's output, h head-major. Not gated: the cell norm, h token-major.
template <bool gated>
void forward(const float* h, const float* o, const float* w, const float* b, float* y, float* mean, float* rstd,
             int64_t rows, int64_t T, int64_t H, int64_t D, float eps, int64_t threads) {
    const Layout<gated> layout{T, H, D};
    const int64_t width = H * D;
    // No bias reads zeros, as in the backward, where a `b ? b[j] : 0` in the loop made GCC run it scalar.
    const std::vector<float> no_bias(b ? 0 : width, 0.0f);
    const float* bias = b ? b : no_bias.data();
    over_row_blocks(rows, width, threads, [&](int64_t first, int64_t end, int64_t) {
        for (int64_t row = first; row < end; ++row) {
            for (int64_t head = 0; head < H; ++head) {
                const float* __restrict hr = h + layout.head_offset(row, head);
                const float* __restrict orow = gated ? o + row * width + head * D : nullptr;
                const float* __restrict wr = w + head * D;
                float* __restrict yr = y + row * width + head * D;
                float sum = 0.0f;
                XLSTM_ZOO_SIMD_REDUCE(+ : sum)
                for (int64_t j = 0; j < D; ++j) sum += hr[j];
                const float mu = sum / float(D);
                float squares = 0.0f;  // of the centred values: the variance as layer_norm's (biased)
                XLSTM_ZOO_SIMD_REDUCE(+ : squares)
                for (int64_t j = 0; j < D; ++j) squares += (hr[j] - mu) * (hr[j] - mu);
                const float r = 1.0f / std::sqrt(squares / float(D) + eps);
                mean[row * H + head] = mu;
                rstd[row * H + head] = r;
                const float* __restrict br = bias + head * D;
                XLSTM_ZOO_SIMD
                for (int64_t j = 0; j < D; ++j) {
                    const float z = (hr[j] - mu) * r * wr[j] + br[j];
                    yr[j] = gated ? z * sigmoid(orow[j]) : z;
                }
            }
        }
    });
}

// With n = (h - mean) rstd, z = n w + b, s = sigmoid(o) (1 without a gate): do = dy z s (1 - s); dz = dy s;
// dw = sum dz n, db = sum dz (per block of rows, then over the blocks in order); dh = rstd (g - mean(g) -
// n mean(g n)) per head with g = dz w.
template <bool gated>
void backward(const float* h, const float* o, const float* w, const float* b, const float* mean, const float* rstd,
              const float* dy, float* dh, float* d_o, float* dw, float* db, int64_t rows, int64_t T, int64_t H,
              int64_t D, int64_t threads) {
    const Layout<gated> layout{T, H, D};
    const int64_t width = H * D, blocks = row_blocks(rows);
    std::vector<float> dw_blocks(blocks * width, 0.0f), db_blocks(db ? blocks * width : 0, 0.0f);
    const std::vector<float> no_bias(b ? 0 : width, 0.0f);
    const float* bias = b ? b : no_bias.data();
    over_row_blocks(rows, width, threads, [&](int64_t first, int64_t end, int64_t block) {
        std::vector<float> dz_buffer(D);
        for (int64_t row = first; row < end; ++row) {
            for (int64_t head = 0; head < H; ++head) {
                const int64_t at = layout.head_offset(row, head), col = row * width + head * D;
                const float *__restrict hr = h + at, *__restrict dyr = dy + col, *__restrict wr = w + head * D;
                const float* __restrict orow = gated ? o + col : nullptr;
                float *__restrict dhr = dh + at, *__restrict dz = dz_buffer.data();
                float* __restrict dor = gated ? d_o + col : nullptr;
                float* __restrict dw_block = dw_blocks.data() + block * width + head * D;
                const float* __restrict br = bias + head * D;
                const float mu = mean[row * H + head], r = rstd[row * H + head];
                // Each loop stores through restrict pointers only, unconditionally: with the weight's gradient
                // and an optional bias gradient in the same loop, GCC ran it scalar (2.5x the time).
                float g_sum = 0.0f, gn_sum = 0.0f;
                XLSTM_ZOO_SIMD_REDUCE(+ : g_sum, gn_sum)
                for (int64_t j = 0; j < D; ++j) {
                    const float n = (hr[j] - mu) * r, s = gated ? sigmoid(orow[j]) : 1.0f;
                    dz[j] = dyr[j] * s;
                    if (gated) dor[j] = dyr[j] * (n * wr[j] + br[j]) * s * (1.0f - s);
                    const float g = dz[j] * wr[j];
                    g_sum += g;
                    gn_sum += g * n;
                }
                const float g_mean = g_sum / float(D), gn_mean = gn_sum / float(D);
                XLSTM_ZOO_SIMD
                for (int64_t j = 0; j < D; ++j) {
                    const float n = (hr[j] - mu) * r;
                    dhr[j] = r * (dz[j] * wr[j] - g_mean - n * gn_mean);
                    dw_block[j] += dz[j] * n;
                }
                if (db) {
                    float* __restrict db_block = db_blocks.data() + block * width + head * D;
                    XLSTM_ZOO_SIMD
                    for (int64_t j = 0; j < D; ++j) db_block[j] += dz[j];
                }
            }
        }
    });
    sum_block_partials(dw_blocks, width, dw);
    if (db) sum_block_partials(db_blocks, width, db);
}

}  // namespace

extern "C" void xlstm_zoo_head_norm_gate_forward_f32(const float* h, const float* o, const float* w, const float* b,
                                                     float* y, float* mean, float* rstd, int64_t rows, int64_t T,
                                                     int64_t H, int64_t D, float eps, int64_t threads) {
    forward<true>(h, o, w, b, y, mean, rstd, rows, T, H, D, eps, threads);
}

extern "C" void xlstm_zoo_head_norm_gate_backward_f32(const float* h, const float* o, const float* w, const float* b,
                                                      const float* mean, const float* rstd, const float* dy, float* dh,
                                                      float* d_o, float* dw, float* db, int64_t rows, int64_t T,
                                                      int64_t H, int64_t D, int64_t threads) {
    backward<true>(h, o, w, b, mean, rstd, dy, dh, d_o, dw, db, rows, T, H, D, threads);
}

extern "C" void xlstm_zoo_head_norm_forward_f32(const float* h, const float* w, const float* b, float* y, float* mean,
                                                float* rstd, int64_t rows, int64_t H, int64_t D, float eps,
                                                int64_t threads) {
    forward<false>(h, nullptr, w, b, y, mean, rstd, rows, 1, H, D, eps, threads);
}

extern "C" void xlstm_zoo_head_norm_backward_f32(const float* h, const float* w, const float* b, const float* mean,
                                                 const float* rstd, const float* dy, float* dh, float* dw, float* db,
                                                 int64_t rows, int64_t H, int64_t D, int64_t threads) {
    backward<false>(h, nullptr, w, b, mean, rstd, dy, dh, nullptr, dw, db, rows, 1, H, D, threads);
}
