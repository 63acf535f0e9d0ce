// Shared by the C++ kernels (the recurrent loops, the step kernels, the gated MLP's activation): vectorisable
// gate maths and the split of independent rows over threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#endif

// The gate maths costs five to seven exp/log1p/tanh per unit and token, and scalar libm calls made them
// 75% of the sLSTM loop's time. With XLSTM_ZOO_VECTOR_MATH (build.py tries it first) the loops over units are
// vectorised and call glibc's SIMD versions of these functions (libmvec, within 4 ulp), declared here as
// `omp declare simd` so that -fopenmp-simd can use them; -ffast-math would do the same but also drop
// the NaN semantics that torch.maximum has and these loops keep.
#ifdef XLSTM_ZOO_VECTOR_MATH
extern "C" {
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float log1pf(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
double exp(double);
#pragma omp declare simd notinbranch
double log1p(double);
#pragma omp declare simd notinbranch
double tanh(double);
}
#define XLSTM_ZOO_SIMD _Pragma("omp simd")
#define XLSTM_ZOO_SIMD_REDUCE(...) _Pragma(XLSTM_ZOO_STR(omp simd reduction(__VA_ARGS__)))
#define XLSTM_ZOO_SIMD_REDUCE_TWO(first, second) _Pragma(XLSTM_ZOO_STR(omp simd reduction(first) reduction(second)))
#define XLSTM_ZOO_STR(...) #__VA_ARGS__
#else
#define XLSTM_ZOO_SIMD
#define XLSTM_ZOO_SIMD_REDUCE(...)
#define XLSTM_ZOO_SIMD_REDUCE_TWO(first, second)
#endif

// The gated MLP's gates, RMSNorm, the soft cap, the head norm and gate, the causal conv, the block-diagonal
// map and the LSTM and sLSTM loops start with XLSTM_ZOO_WIDE_VECTORS. GCC tunes several AVX-512 CPUs for
// 256-bit vectors (rocketlake among them) and then calls libmvec's 8-wide exp and tanh. These files gain
// from 512-bit vectors and the mLSTM chunk kernels lose (docs/performance.md), so only these files ask. It applies to
// functions defined after it: a loop inside a lambda handed to a template declared earlier keeps the
// default width (so the soft cap's, the gated MLP's gates' and the causal conv's loops are out-of-line
// functions).
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
#define XLSTM_ZOO_WIDE_VECTORS _Pragma("GCC target(\"prefer-vector-width=512\")")
#else
#define XLSTM_ZOO_WIDE_VECTORS
#endif

namespace xlstm_zoo {

inline float vexp(float x) { return expf(x); }
inline double vexp(double x) { return exp(x); }
inline float vlog1p(float x) { return log1pf(x); }
inline double vlog1p(double x) { return log1p(x); }
inline float vtanh(float x) { return tanhf(x); }
inline double vtanh(double x) { return tanh(x); }

template <typename T>
inline T log_sigmoid(T x) {
    // torch.nn.functional.softplus(x, beta=-1) (the fused backend's log sigmoid): linear below -20.
    return x < T(-20) ? x : -vlog1p(vexp(-x));
}

template <typename T>
inline T sigmoid(T x) { return T(1) / (T(1) + vexp(-x)); }

// The standard normal's distribution function Phi(x) = (1 + erf(x / sqrt 2)) / 2, for the exact GELU
// x Phi(x). erf from Abramowitz & Stegun's formula 7.1.26 (absolute error below 1.5e-7, the same formula
// that PyTorch's vectorised CPU erf uses), written with exp only so that the loops over units vectorise;
// for x < 0 Phi is the tail itself, without the cancellation of 1 - erf.
inline float normal_cdf(float x) {
    const float z = std::fabs(x) * 0.70710678f, t = 1.0f / (1.0f + 0.3275911f * z);
    const float series =
        t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    const float tail = 0.5f * series * vexp(-z * z);  // (1 - erf(z)) / 2
    return x < 0.0f ? tail : 1.0f - tail;
}

template <typename T, bool exponential>
inline T log_gate(T pre) { return exponential ? pre : log_sigmoid(pre); }

// One row of the gated MLP's SiLU gate, out = silu(g) * up: gated_activation.cpp's forward and the 7B block
// step (block_step.cpp) both, so that the two compute the same formula (the first with 512-bit vectors
// where XLSTM_ZOO_WIDE_VECTORS asks, so the two may round exp differently in the last bit).
inline void silu_gate_row(const float* __restrict g, const float* __restrict up, float* __restrict out, int64_t F) {
    XLSTM_ZOO_SIMD
    for (int64_t j = 0; j < F; ++j) out[j] = g[j] * sigmoid(g[j]) * up[j];
}

template <typename T>
inline T nan_max(T a, T b) {  // torch.maximum: NaN wins (written without calls, so it vectorises)
    return (a != a || b != b) ? std::numeric_limits<T>::quiet_NaN() : (a > b ? a : b);
}

// nan_max folded over x[0..n) from init. As a fold it runs scalar (each step tests for NaN); here the max of
// the numbers and whether one was NaN are reduced apart, so the loop vectorises (a max in any order is the
// same number, up to the sign of a zero).
static inline float nan_max_over(const float* x, int64_t n, float init) {
    float top = init;
    int nan = init != init;
    XLSTM_ZOO_SIMD_REDUCE_TWO(max : top, | : nan)
    for (int64_t j = 0; j < n; ++j) {
        top = x[j] > top ? x[j] : top;
        nan |= x[j] != x[j];
    }
    return nan ? std::numeric_limits<float>::quiet_NaN() : top;
}

// g = w + h_prev R for one row: R is [D, 4D] row-major, so the inner loop is an axpy that vectorises.
template <typename T>
inline void preactivations(T* __restrict g, const T* w, const T* __restrict h, const T* R, int64_t D) {
    const int64_t D4 = 4 * D;
    std::copy(w, w + D4, g);
    for (int64_t k = 0; k < D; ++k) {
        const T hk = h[k];
        const T* r = R + k * D4;
        for (int64_t j = 0; j < D4; ++j) g[j] += hk * r[j];
    }
}

// dh_prev = dg R^T for one row, as axpys over the rows of Rt = R^T ([4D, D] row-major).
template <typename T>
inline void recurrent_input_grad(T* __restrict dh, const T* __restrict dg, const T* Rt, int64_t D) {
    std::fill(dh, dh + D, T(0));
    for (int64_t j = 0; j < 4 * D; ++j) {
        const T dgj = dg[j];
        const T* r = Rt + j * D;
        for (int64_t k = 0; k < D; ++k) dh[k] += dgj * r[k];
    }
}

// A row's slice of an optional [rows, D] input (null: zeros).
template <typename T>
inline void load_row(T* to, const T* from, int64_t row, int64_t D) {
    if (from) std::copy(from + row * D, from + (row + 1) * D, to);
    else std::fill(to, to + D, T(0));
}

// Below this many recurrent multiply-adds per thread a call stays on one thread: starting one costs tens
// of microseconds, and on a busy machine a started thread may wait milliseconds for a core.
constexpr int64_t kMinWorkPerThread = int64_t(1) << 22;

// Subnormal floats (below 1.2e-38) cost about a hundred cycles per operation on x86 CPUs, and the mLSTM's
// decays reach them wherever strong forget gates separate two tokens of a chunk (the op ran several times
// slower with strongly closed forget gates). Our
// kernels read and write them as 0 (the MXCSR's flush-to-zero and denormals-are-zero bits), on every
// thread for the duration of its work only; the caller's setting comes back after. Against the values
// they are summed with, they are far below float rounding.
class FlushSubnormals {
#if defined(__x86_64__) || defined(__SSE2__)
  public:
    FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero); }
    ~FlushSubnormals() { _mm_setcsr(saved_); }
    FlushSubnormals(const FlushSubnormals&) = delete;
    FlushSubnormals& operator=(const FlushSubnormals&) = delete;

  private:
    static constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
    unsigned saved_;
#endif
};

// Independent rows split over threads: they claim rows one at a time from a shared counter (so a thread
// that starts late takes fewer), one launch per call. Each thread (the calling one too) makes its own
// worker with make_worker() (its buffers, its settings) and calls worker(row) for each row it claims; each
// row's result is the same whichever thread runs it.
//
// Built with OpenMP (build.py tries it first), the threads are those of the process's OpenMP runtime,
// which is torch's own (libgomp, loaded once by soname): after a torch op its threads spin for a while
// waiting for more work, and threads of our own would compete with them for the cores.
template <typename MakeWorker>
void parallel_rows(int64_t rows, int64_t threads, const MakeWorker& make_worker) {
    threads = std::max<int64_t>(1, std::min(threads, rows));
    std::atomic<int64_t> next{0};
    auto claim = [&]() {
        FlushSubnormals flush;
        auto worker = make_worker();
        for (int64_t row; (row = next.fetch_add(1)) < rows;) worker(row);
    };
#ifdef _OPENMP
#pragma omp parallel num_threads(static_cast<int>(threads))
    claim();
#else
    std::vector<std::thread> pool;
    for (int64_t i = 1; i < threads; ++i) pool.emplace_back(claim);
    claim();  // this thread works too
    for (auto& thread : pool) thread.join();
#endif
}

// The per-row kernels (the SiLU gate, RMSNorm, the soft cap): rows in fixed blocks of kRowsPerBlock,
// claimed by threads, body(first, end, block) for each; calls under kMinElementsForThreads stay on one
// thread. A block's rows are the same whichever thread runs it, so a kernel that keeps one partial sum
// per block (RMSNorm's weight gradient) adds them up in the same order every time.
constexpr int64_t kRowsPerBlock = 16;
constexpr int64_t kMinElementsForThreads = int64_t(1) << 16;

inline int64_t row_blocks(int64_t rows) { return (rows + kRowsPerBlock - 1) / kRowsPerBlock; }

template <typename Body>
void over_row_blocks(int64_t rows, int64_t width, int64_t threads, const Body& body) {
    if (rows * width < kMinElementsForThreads) threads = 1;
    parallel_rows(row_blocks(rows), threads, [&]() {
        return [&](int64_t block) {
            body(block * kRowsPerBlock, std::min(rows, (block + 1) * kRowsPerBlock), block);
        };
    });
}

// out[j] = the sum over blocks of partials[block * width + j], in block order: a weight's gradient kept
// per block of rows by over_row_blocks' callers, the same bits on any thread count.
inline void sum_block_partials(const std::vector<float>& partials, int64_t width, float* out) {
    std::fill(out, out + width, 0.0f);
    for (size_t at = 0; at < partials.size(); at += size_t(width)) {
        XLSTM_ZOO_SIMD
        for (int64_t j = 0; j < width; ++j) out[j] += partials[at + j];
    }
}

// The recurrent loops: (head, batch) rows are independent recurrences; small calls stay on one thread.
template <typename P>
void run(const P& p, void (*rows_fn)(const P&, int64_t, int64_t), int64_t threads) {
    const int64_t rows = p.heads * p.batch, work = rows * p.steps * p.dim * p.dim * 4;
    threads = std::min(threads, work / kMinWorkPerThread);
    if (threads <= 1) {
        FlushSubnormals flush;
        return rows_fn(p, 0, rows);
    }
    parallel_rows(rows, threads, [&]() { return [&](int64_t row) { rows_fn(p, row, row + 1); }; });
}

}  // namespace xlstm_zoo
