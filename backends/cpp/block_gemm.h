// Row-major matrix products for the small matrices of one mLSTM chunk block (64 x 64 at the defaults),
// which sit in the calling thread's cache. A BLAS call pays for packing its operands first, which at
// these sizes costs about as much as the arithmetic; here the product runs from the operands in place,
// with register tiles of 4 rows x 1-4 vectors of one register's width (AVX-512, AVX2 or SSE under
// -march=native).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=fast")  // a + b * c as one fused multiply-add (Clang contracts by default)
#endif

namespace xlstm_zoo {

// The products' tiles use vectors of one register's width, and as many per row as the registers hold: 4 rows
// x 4 accumulators and a row of B fit AVX-512's 32 registers, not AVX2's 16. A vector type wider than the
// registers is split into register-sized parts, so 16-wide tiles on AVX2 spilled to the stack (measured in
// docs/performance.md).
#if defined(__AVX512F__)
constexpr int kTileLanes = 16, kTileVectors = 4;
#elif defined(__AVX__)
constexpr int kTileLanes = 8, kTileVectors = 2;
#else
constexpr int kTileLanes = 4, kTileVectors = 2;
#endif
typedef float tvec __attribute__((vector_size(kTileLanes * sizeof(float)), aligned(sizeof(float))));
// Unaligned loads and stores through a may_alias type: memcpy stalled on GCC's tuning for some Intel CPUs
// (docs/performance.md).
typedef float tvec_mem __attribute__((vector_size(kTileLanes * sizeof(float)), aligned(sizeof(float)), may_alias));
inline tvec tload(const float* p) { return *reinterpret_cast<const tvec_mem*>(p); }
inline void tstore(float* p, tvec v) { *reinterpret_cast<tvec_mem*>(p) = v; }

// The matrix that a product is added onto (null: none), with its row stride: C itself to accumulate, or
// another matrix of C's shape (C = W + op(A) B without first copying W into C).
struct Addend {
    const float* at;
    int ld;
};

// C[i0:i0+MR, j0:j0+kTileLanes NV] = (beta addend +) op(A) B, op(A) = A [M, K] or A^T for A [K, M].
template <bool TransA, int MR, int NV>
inline void tile(int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc, Addend add,
                 float beta, int i0, int j0) {
    tvec acc[MR][NV];
    for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v)
            acc[r][v] = add.at ? tload(add.at + int64_t(i0 + r) * add.ld + j0 + v * kTileLanes) * beta : tvec{};
    for (int k = 0; k < K; ++k) {
        const float* b_row = B + int64_t(k) * ldb + j0;
        tvec b[NV];
        for (int v = 0; v < NV; ++v) b[v] = tload(b_row + v * kTileLanes);
        for (int r = 0; r < MR; ++r) {
            const float a = TransA ? A[int64_t(k) * lda + i0 + r] : A[int64_t(i0 + r) * lda + k];
            for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
        }
    }
    for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v) tstore(C + int64_t(i0 + r) * ldc + j0 + v * kTileLanes, acc[r][v]);
}

template <bool TransA, int NV>
inline void column_block(int M, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                         Addend add, float beta, int j0) {
    int i = 0;
    for (; i + 4 <= M; i += 4) tile<TransA, 4, NV>(K, A, lda, B, ldb, C, ldc, add, beta, i, j0);
    for (; i < M; ++i) tile<TransA, 1, NV>(K, A, lda, B, ldb, C, ldc, add, beta, i, j0);
}

// Rows i0..i0+MR of the last `width` (< kTileLanes) columns of C, from B's columns copied into `panel`
// [K, kTileLanes] (zeros beyond `width`): C's values go through a one-vector row buffer, so every product is a
// vector one.
template <bool TransA, int MR>
inline void remainder_tile(int K, const float* A, int lda, const float* panel, float* C, int ldc, Addend add,
                           float beta, int i0, int j0, int width) {
    tvec acc[MR];
    for (int r = 0; r < MR; ++r) {
        float row[kTileLanes] = {};
        if (add.at)
            for (int c = 0; c < width; ++c) row[c] = add.at[int64_t(i0 + r) * add.ld + j0 + c] * beta;
        acc[r] = tload(row);
    }
    for (int k = 0; k < K; ++k) {
        const tvec b = tload(panel + int64_t(k) * kTileLanes);
        for (int r = 0; r < MR; ++r)
            acc[r] += (TransA ? A[int64_t(k) * lda + i0 + r] : A[int64_t(i0 + r) * lda + k]) * b;
    }
    for (int r = 0; r < MR; ++r) {
        float row[kTileLanes];
        tstore(row, acc[r]);
        for (int c = 0; c < width; ++c) C[int64_t(i0 + r) * ldc + j0 + c] = row[c];
    }
}

// C [M, N] = (beta addend +) op(A) B with B [K, N].
template <bool TransA>
void gemm_b_onto(int M, int N, int K, const float* A, int lda, const float* B, int ldb, Addend add, float* C,
                 int ldc, float beta = 1.0f) {
    int j = 0;
    if constexpr (kTileVectors >= 4)
        for (; j + 4 * kTileLanes <= N; j += 4 * kTileLanes)
            column_block<TransA, 4>(M, K, A, lda, B, ldb, C, ldc, add, beta, j);
    for (; j + 2 * kTileLanes <= N; j += 2 * kTileLanes)
        column_block<TransA, 2>(M, K, A, lda, B, ldb, C, ldc, add, beta, j);
    for (; j + kTileLanes <= N; j += kTileLanes) column_block<TransA, 1>(M, K, A, lda, B, ldb, C, ldc, add, beta, j);
    if (j == N) return;
    // The last N % kTileLanes columns (a tail chunk shorter than the chunk size, an odd head width): as vector
    // products over a zero-padded copy of B's columns; a scalar loop here took most of the time
    // of short sequences (the quick grids' mLSTM op, L = 12-28 tokens).
    const int width = N - j;
    thread_local std::vector<float> panel;
    panel.assign(size_t(K) * kTileLanes, 0.0f);
    for (int k = 0; k < K; ++k)
        for (int c = 0; c < width; ++c) panel[size_t(k) * kTileLanes + c] = B[int64_t(k) * ldb + j + c];
    int i = 0;
    for (; i + 4 <= M; i += 4) remainder_tile<TransA, 4>(K, A, lda, panel.data(), C, ldc, add, beta, i, j, width);
    for (; i < M; ++i) remainder_tile<TransA, 1>(K, A, lda, panel.data(), C, ldc, add, beta, i, j, width);
}

// C [M, N] = (beta C +) op(A) B with B [K, N].
template <bool TransA>
void gemm_b_plain(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                  bool accumulate, float beta = 1.0f) {
    gemm_b_onto<TransA>(M, N, K, A, lda, B, ldb, Addend{accumulate ? C : nullptr, ldc}, C, ldc, beta);
}

// dst [K, N] = src^T for src [N, K] (row stride lds), element by element. (An 8 x 8 shuffle transpose
// measured under the complexity budget's 10% on the mLSTM op; docs/performance.md.)
inline void transpose_into(const float* src, int lds, int N, int K, float* dst) {
    for (int n = 0; n < N; ++n)
        for (int k = 0; k < K; ++k) dst[int64_t(k) * N + n] = src[int64_t(n) * lds + k];
}

// Row-major C [M, N] (+)= op(A) op(B), op(A) [M, K], op(B) [K, N]; ld* are row strides. A transposed B
// ([N, K] stored) is first copied transposed into scratch (K * N floats). With accumulate, C's old values
// are scaled by beta first, as they are loaded (a separate pass over C would stream it through the cache
// once more).
inline void block_gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                       int ldb, bool accumulate, float* C, int ldc, float* scratch, float beta = 1.0f) {
    if (trans_b) {
        transpose_into(B, ldb, N, K, scratch);
        B = scratch;
        ldb = N;
    }
    if (trans_a) gemm_b_plain<true>(M, N, K, A, lda, B, ldb, C, ldc, accumulate, beta);
    else gemm_b_plain<false>(M, N, K, A, lda, B, ldb, C, ldc, accumulate, beta);
}

}  // namespace xlstm_zoo
