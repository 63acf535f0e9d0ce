// The batched recurrent loops' schedule (lstm_loop.cpp, slstm_loop.cpp): one token for all batch rows at
// once, a small matrix product per head, with a team of threads splitting each head's units and waiting for
// each other once per token (the next token's product reads every unit of h).
#pragma once

#ifdef _OPENMP
#include <omp.h>
#endif

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

}  // namespace xlstm_zoo
