// A block-diagonal linear map with small square blocks, y[n, b*S + o] = sum_i x[n, b*S + i] W[b, i, o]
// (+ bias), S in {2, 4, 8, 16}: the NeurIPS mLSTM's q/k/v projections (4 x 4 blocks). PyTorch runs it as
// an einsum, a batched matmul of many 4 x 4 blocks with two layout copies. Here a 16-wide vector of x holds 16 / S whole blocks; for each i the vector with x[b, i]
// repeated over block b's lanes (a lane permutation) times the weights laid out the same way gives all
// sixteen outputs in S multiply-adds.
//
// The backward: dx is the same map with each block transposed; dW[b, i, o] = sum_n x[n, b, i] dy[n, b, o]
// and dbias = sum_n dy, summed per block of rows, then over the blocks in order (the same bits on any
// thread count).

#include <cstdint>
#include <vector>

#include "loops.h"

XLSTM_ZOO_WIDE_VECTORS

using namespace xlstm_zoo;

namespace {

// Vectors of 16 floats, whatever the registers' width: a vector holds 16 / S whole blocks (a wider type
// than the registers is split into register-sized parts by the compiler).
constexpr int kLanes = 16;
typedef float vfloat __attribute__((vector_size(kLanes * sizeof(float)), aligned(sizeof(float))));
typedef float vfloat_mem __attribute__((vector_size(kLanes * sizeof(float)), aligned(sizeof(float)), may_alias));
inline vfloat vload(const float* p) { return *reinterpret_cast<const vfloat_mem*>(p); }
inline void vstore(float* p, vfloat v) { *reinterpret_cast<vfloat_mem*>(p) = v; }

typedef int32_t vint __attribute__((vector_size(kLanes * sizeof(int32_t))));

// Lane l takes lane (l / S) * S + i: x[b, i] over block b's S lanes.
template <int S>
inline vint spread_mask(int i) {
    vint m;
    for (int l = 0; l < kLanes; ++l) m[l] = (l / S) * S + i;
    return m;
}

inline vfloat permute(vfloat v, vint m) {
#if defined(__GNUC__) && !defined(__clang__)
    return __builtin_shuffle(v, m);
#else
    vfloat out;
    for (int l = 0; l < kLanes; ++l) out[l] = v[m[l]];
    return out;
#endif
}

// W [blocks, S, S] laid out per input index i as a row over the outputs: wide[i * width + b*S + o] =
// W[b, i, o], or W[b, o, i] (transposed: the input's gradient).
template <int S>
std::vector<float> lane_weights(const float* W, int64_t width, bool transpose) {
    std::vector<float> wide(S * width);
    for (int64_t b = 0; b < width / S; ++b)
        for (int i = 0; i < S; ++i)
            for (int o = 0; o < S; ++o)
                wide[i * width + b * S + o] = transpose ? W[(b * S + o) * S + i] : W[(b * S + i) * S + o];
    return wide;
}

// x's rows are x_stride floats apart (a half of a wider tensor qualifies); y's are contiguous.
template <int S>
__attribute__((noinline)) void map_rows(const float* x, int64_t x_stride, const float* wide, const float* bias,
                                        float* y, int64_t first, int64_t end, int64_t width) {
    vint masks[S];
    for (int i = 0; i < S; ++i) masks[i] = spread_mask<S>(i);
    for (int64_t n = first; n < end; ++n) {
        const float* xr = x + n * x_stride;
        float* yr = y + n * width;
        for (int64_t j = 0; j < width; j += kLanes) {
            const vfloat xv = vload(xr + j);
            vfloat acc = bias ? vload(bias + j) : vfloat{};
            for (int i = 0; i < S; ++i) acc += permute(xv, masks[i]) * vload(wide + i * width + j);
            vstore(yr + j, acc);
        }
    }
}

// Adds this block of rows' dW (as wide rows: dw_wide[i * width + b*S + o]) and dbias.
template <int S>
__attribute__((noinline)) void weight_gradient_rows(const float* x, int64_t x_stride, const float* dy, float* dw_wide,
                                                    float* dbias, int64_t first, int64_t end, int64_t width) {
    vint masks[S];
    for (int i = 0; i < S; ++i) masks[i] = spread_mask<S>(i);
    for (int64_t n = first; n < end; ++n) {
        const float *xr = x + n * x_stride, *dyr = dy + n * width;
        for (int64_t j = 0; j < width; j += kLanes) {
            const vfloat xv = vload(xr + j), dv = vload(dyr + j);
            for (int i = 0; i < S; ++i) {
                float* at = dw_wide + i * width + j;
                vstore(at, vload(at) + permute(xv, masks[i]) * dv);
            }
            if (dbias) vstore(dbias + j, vload(dbias + j) + dv);
        }
    }
}

template <int S>
void forward(const float* x, int64_t x_stride, const float* W, const float* bias, float* y, int64_t rows,
             int64_t width, int64_t threads) {
    const std::vector<float> wide = lane_weights<S>(W, width, false);
    over_row_blocks(rows, width, threads, [&](int64_t first, int64_t end, int64_t) {
        map_rows<S>(x, x_stride, wide.data(), bias, y, first, end, width);
    });
}

template <int S>
void backward(const float* x, int64_t x_stride, const float* W, const float* dy, float* dx, float* dW, float* dbias,
              int64_t rows, int64_t width, int64_t threads) {
    const std::vector<float> wide_t = lane_weights<S>(W, width, true);
    const int64_t blocks = row_blocks(rows), per_block = (S + (dbias ? 1 : 0)) * width;
    std::vector<float> partials(blocks * per_block, 0.0f);
    over_row_blocks(rows, width, threads, [&](int64_t first, int64_t end, int64_t block) {
        if (dx) map_rows<S>(dy, width, wide_t.data(), nullptr, dx, first, end, width);
        float* mine = partials.data() + block * per_block;
        weight_gradient_rows<S>(x, x_stride, dy, mine, dbias ? mine + S * width : nullptr, first, end, width);
    });
    std::vector<float> sums(per_block);
    sum_block_partials(partials, per_block, sums.data());
    for (int64_t b = 0; b < width / S; ++b)
        for (int i = 0; i < S; ++i)
            for (int o = 0; o < S; ++o) dW[(b * S + i) * S + o] = sums[i * width + b * S + o];
    if (dbias) std::copy(sums.begin() + S * width, sums.end(), dbias);
}

}  // namespace

// x [rows, width] with rows x_stride floats apart, y [rows, width], W [width / S, S, S], bias [width] or null;
// width a multiple of 16, S in {2, 4, 8, 16}.
extern "C" void xlstm_zoo_block_diagonal_forward_f32(const float* x, int64_t x_stride, const float* W,
                                                     const float* bias, float* y, int64_t rows, int64_t width,
                                                     int64_t S, int64_t threads) {
    switch (S) {
        case 2: return forward<2>(x, x_stride, W, bias, y, rows, width, threads);
        case 4: return forward<4>(x, x_stride, W, bias, y, rows, width, threads);
        case 8: return forward<8>(x, x_stride, W, bias, y, rows, width, threads);
        case 16: return forward<16>(x, x_stride, W, bias, y, rows, width, threads);
    }
}

// dx (null: not wanted; contiguous), dW, dbias (null: no bias) from dy [rows, width] (contiguous).
extern "C" void xlstm_zoo_block_diagonal_backward_f32(const float* x, int64_t x_stride, const float* W,
                                                      const float* dy, float* dx, float* dW, float* dbias,
                                                      int64_t rows, int64_t width, int64_t S, int64_t threads) {
    switch (S) {
        case 2: return backward<2>(x, x_stride, W, dy, dx, dW, dbias, rows, width, threads);
        case 4: return backward<4>(x, x_stride, W, dy, dx, dW, dbias, rows, width, threads);
        case 8: return backward<8>(x, x_stride, W, dy, dx, dW, dbias, rows, width, threads);
        case 16: return backward<16>(x, x_stride, W, dy, dx, dW, dbias, rows, width, threads);
    }
}
