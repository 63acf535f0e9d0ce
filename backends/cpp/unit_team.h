// The batched recurrent loops' schedule (lstm_loop.cpp, slstm_loop.cpp): one token for all batch rows at
// once, a small matrix product per head, with a team of threads splitting each head's units and waiting for
// each other once per token (the next token's product reads every unit of h).
#pragma once

#ifdef _OPENMP
#include <omp.h>
#endif

#include "block_gemm.h"
#include "loops.h"

namespace xlstm_zoo {

// Units are split over threads in blocks of 16 (whole vectors on every ISA); heads narrower than that run
// the row loop.
constexpr int64_t kUnitBlock = 16;

// The units [j0, j1) of every head that thread `index` of `count` owns (contiguous, multiples of
// kUnitBlock where possible).
inline void owned_units(int64_t D, int index, int count, int64_t& j0, int64_t& j1) {
    const int64_t blocks = (D + kUnitBlock - 1) / kUnitBlock;
    j0 = std::min(D, blocks * index / count * kUnitBlock);
    j1 = std::min(D, blocks * (index + 1) / count * kUnitBlock);
}

// Threads for a batched loop: a barrier per token costs about a microsecond, so each thread needs some
// thousands of multiply-adds per token (and at least one vector of units).
inline int batched_threads(int64_t heads, int64_t batch, int64_t D, int64_t threads) {
    const int64_t per_token = heads * batch * D * 4 * D;
    const int64_t unit_blocks = (D + kUnitBlock - 1) / kUnitBlock;
    return int(std::max<int64_t>(1, std::min({threads, per_token / (int64_t(1) << 15), unit_blocks})));
}

// The threads of one team wait for each other once per token: OpenMP's own barrier (an orphaned directive
// binds to the team's parallel region). Without OpenMP the team is the calling thread alone.
struct TeamBarrier {
    void wait() const {
#ifdef _OPENMP
#pragma omp barrier
#endif
    }
};

// `body(index, count, barrier)` on a team of `count` threads (fewer if the runtime gives fewer). Without
// OpenMP: the calling thread alone (a barrier per token wants threads that stay in one team).
template <typename Body>
void team(int count, const Body& body) {
    const TeamBarrier barrier;
#ifdef _OPENMP
#pragma omp parallel num_threads(count)
    {
        FlushSubnormals flush;
        body(omp_get_thread_num(), omp_get_num_threads(), barrier);
    }
#else
    (void)count;
    FlushSubnormals flush;
    body(0, 1, barrier);
#endif
}

// G = W + h_prev R for the B rows of one head and token, this thread's units [j0, j1) of each of the four gates
// (W read in place, h_prev [B, D], R [D, 4D]); a row whose document starts here (restarts(b)) enters from h = 0,
// so G = W there.
template <typename Restarts>
inline void unit_preactivations(int64_t B, int64_t D, int64_t j0, int64_t j1, const float* h_prev, const float* R,
                                const float* W, float* G, const Restarts& restarts) {
    const int64_t D4 = 4 * D;
    if (j1 > j0)
        for (int gate = 0; gate < 4; ++gate) {
            const int64_t col = gate * D + j0;
            gemm_b_onto<false>(int(B), int(j1 - j0), int(D), h_prev, int(D), R + col, int(D4), Addend{W + col, int(D4)},
                               G + col, int(D4));
        }
    for (int64_t b = 0; b < B; ++b)
        if (restarts(b))
            for (int gate = 0; gate < 4; ++gate)
                std::copy(W + b * D4 + gate * D + j0, W + b * D4 + gate * D + j1, G + b * D4 + gate * D + j0);
}

// dh_prev = dG R^T for the B rows of one head and token, this thread's units [j0, j1) (dG [B, 4D], Rt = R^T
// [4D, D], dh_rec [B, D]); nothing reaches the h before a document start (restarts(b)).
template <typename Restarts>
inline void unit_recurrent_grad(int64_t B, int64_t D, int64_t j0, int64_t j1, const float* dG, const float* Rt,
                                float* dh_rec, const Restarts& restarts) {
    if (j1 > j0)
        gemm_b_plain<false>(int(B), int(j1 - j0), int(4 * D), dG, int(4 * D), Rt + j0, int(D), dh_rec + j0, int(D),
                            false);
    for (int64_t b = 0; b < B; ++b)
        if (restarts(b)) std::fill(dh_rec + b * D + j0, dh_rec + b * D + j1, 0.0f);
}

}  // namespace xlstm_zoo
