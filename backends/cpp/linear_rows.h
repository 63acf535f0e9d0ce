// y [M, N] = x [M, K] W^T (+ b) for the few rows of a generation step (M = batch size, no autograd),
// W [N, K] in nn.Linear's layout, read in place. Used by linear_step.cpp (one product per call) and
// block_step.cpp (several products per parallel region).
//
// The output columns are split over threads in panels of 64 (one W panel is read by one thread only).
// Each panel is a run of dot products vectorised along K: 2 x rows by kDotColumns W rows at a time (1 by
// kDotColumns for an odd last row); the tile of W stays in cache for the next rows of x. (On AVX-512, tiles of
// 4 x 4, 8 x 2, 4 x 6 and 8 x 3 measured 0-25% slower than 2 x 8 at M = 16, d = 256-1024; AVX2 has half the
// registers, so 2 x 4 there.)
#pragma once

#include "block_gemm.h"  // tvec, tload: one register of floats
#include "loops.h"

namespace xlstm_zoo {

constexpr int64_t kPanel = 64;  // output columns per claim
// Below this many multiply-adds a call stays on the calling thread: waking a second one costs more.
constexpr int64_t kMinParallelWork = int64_t(1) << 15;

// W rows per tile: 2 x this many accumulators, their W vectors and an x vector stay in registers.
constexpr int kDotColumns = kTileVectors >= 4 ? 8 : 4;

// The sum of a vector's lanes as a tree of halves: four dependent adds for 16 lanes, not fifteen in a row
// (the compiler may not reorder a float sum itself). A 2 x 8 tile's 16 sums cost about as much as its
// multiply-adds at K = 256 the sequential way.
inline float lane_sum(tvec v) {
    typedef float half4 __attribute__((vector_size(4 * sizeof(float))));
#if defined(__AVX512F__)
    typedef float half8 __attribute__((vector_size(8 * sizeof(float))));
    const half8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                    __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const half4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
#elif defined(__AVX__)
    const half4 b = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
#else
    const half4 b = v;
#endif
    return (b[0] + b[2]) + (b[1] + b[3]);
}

// y[m0:m0+MR, n0:n0+NR] = x[m0:m0+MR] W[n0:n0+NR]^T: MR x NR dot products, vectorised along K.
template <int MR, int NR>
inline void dot_tile(int64_t K, const float* x, const float* W, float* y, int64_t ldy) {
    tvec acc[MR][NR] = {};
    int64_t k = 0;
    for (; k + kTileLanes <= K; k += kTileLanes) {
        tvec w[NR];
        for (int c = 0; c < NR; ++c) w[c] = tload(W + c * K + k);
        for (int r = 0; r < MR; ++r) {
            const tvec xv = tload(x + r * K + k);
            for (int c = 0; c < NR; ++c) acc[r][c] += xv * w[c];
        }
    }
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NR; ++c) {
            float s = lane_sum(acc[r][c]);
            for (int64_t kk = k; kk < K; ++kk) s += x[r * K + kk] * W[c * K + kk];
            y[r * ldy + c] = s;
        }
}

struct Linear {
    const float *x, *W, *b;  // b may be null
    float* y;
    int64_t M, N, K;

    int64_t panels() const { return (N + kPanel - 1) / kPanel; }
    int64_t work() const { return M * N * K; }
};

// Columns [n0, n1) of rows m0..m0+MR: the MR rows share each W tile.
template <int MR, int NR>
inline void rows_of(const Linear& p, int64_t m0, int64_t n0, int64_t n1) {
    int64_t n = n0;
    for (; n + NR <= n1; n += NR) dot_tile<MR, NR>(p.K, p.x + m0 * p.K, p.W + n * p.K, p.y + m0 * p.N + n, p.N);
    for (; n < n1; ++n) dot_tile<MR, 1>(p.K, p.x + m0 * p.K, p.W + n * p.K, p.y + m0 * p.N + n, p.N);
}

inline void linear_panel(const Linear& p, int64_t index) {
    const int64_t n0 = index * kPanel, n1 = std::min(p.N, n0 + kPanel);
    int64_t m = 0;
    for (; m + 2 <= p.M; m += 2) rows_of<2, kDotColumns>(p, m, n0, n1);
    for (; m < p.M; ++m) rows_of<1, kDotColumns>(p, m, n0, n1);
    if (p.b)
        for (int64_t r = 0; r < p.M; ++r)
            for (int64_t n = n0; n < n1; ++n) p.y[r * p.N + n] += p.b[n];
}

// Several independent products in one parallel region, their panels numbered one after another.
template <int MaxParts>
inline void linear_parts(const Linear (&parts)[MaxParts], int count, int64_t threads) {
    int64_t first[MaxParts + 1] = {0}, work = 0;
    for (int j = 0; j < count; ++j) {
        first[j + 1] = first[j] + parts[j].panels();
        work += parts[j].work();
    }
    if (work < kMinParallelWork) threads = 1;
    parallel_rows(first[count], threads, [&]() {
        return [&](int64_t index) {
            int j = 0;
            while (index >= first[j + 1]) ++j;
            linear_panel(parts[j], index - first[j]);
        };
    });
}

}  // namespace xlstm_zoo
