// Mamba's selective scan (backends/reference/selective_scan.py), forward and backward, for float32 CPU tensors:
// per channel e and state n,
//     h_t = exp(dt_t A) h_{t-1} + dt_t u_t B_t        y_t = sum_n C_t[n] h_t[n]
// with u, dt, y [B, T, E], A [E, N], B, C [B, T, N], states [B, E, N]. The PyTorch forms materialise
// [B, T, E, N] decay and input tensors; here each (sequence, block of kLanes channels) runs over time once
// with its state ([N][kLanes], a few KB) in cache, the loops over the channel lanes vectorised (the output
// sums over n, so lanes over channels need no horizontal sums forward).
//
// The backward runs time in reverse with the state's gradient g_t = dL/dh_t:
//     g_t = a_{t+1} g_{t+1} + dy_t C_t,   a_t = exp(dt_t A)
//     du_t = dt_t sum_n g_t B_t           ddt_t = sum_n g_t (u_t B_t + A h_{t-1} a_t)
//     dB_t = sum_e g_t dt_t u_t           dC_t = sum_e dy_t h_t        dA = sum_{b,t} g_t h_{t-1} a_t dt_t
// It needs h_{t-1}: the forward keeps the state at the start of every chunk of `chunk` steps
// ([B, chunks, E, N], 1/chunk of what keeping every state would take), and the backward recomputes each
// chunk's states (and decays) from there into a per-thread buffer before running the chunk in reverse.
//
// Document boundaries: starts [B, T] (bytes, null: none) is 1 where a document starts; there a_t = 0, so the
// state carried in is dropped (forward) and nothing flows back past t (backward, through the same a_t).
//
// Work units are (sequence, group of kGroup channels). Sums over channels (dB, dC) are kept per group and
// sums over sequences (dA) per sequence, then added in a fixed order: the same bits on any thread count.

#include "loops.h"

using namespace xlstm_zoo;

namespace {

constexpr int64_t kLanes = 16;   // channels a block runs at once: one AVX-512 vector, two AVX2 ones
constexpr int64_t kGroup = 64;   // channels per work unit (the dB, dC partial sums are per unit)
// Below this many state updates (B T E N) a call stays on one thread: a thread costs tens of microseconds
// to start and an update about a nanosecond.
constexpr int64_t kMinUpdatesForThreads = int64_t(1) << 18;

struct Scan {
    const float *u, *dt, *A, *B, *C, *h0;
    const uint8_t* starts;
    int64_t batch, T, E, N, chunk;

    int64_t chunks() const { return (T + chunk - 1) / chunk; }
    int64_t groups() const { return (E + kGroup - 1) / kGroup; }
};

// One block: `width` (<= kLanes) channels from e0 of sequence b. The lanes past `width` hold zeros (dt = 0:
// no decay, no input), so every loop runs the full kLanes and vectorises without a remainder.
struct Block {
    int64_t b, e0, width;
};

// The block's lanes of a [.., E] row into lane[kLanes], zeros past the width.
inline void load_lanes(const float* row, const Block& k, float* __restrict lane) {
    for (int64_t j = 0; j < kLanes; ++j) lane[j] = j < k.width ? row[k.e0 + j] : 0.0f;
}

// A state [B, E, N] (its sequence b's slice at `state`) to and from the block's layout [N][kLanes].
inline void load_state(const float* state, const Scan& p, const Block& k, float* __restrict h) {
    for (int64_t n = 0; n < p.N; ++n)
        for (int64_t j = 0; j < kLanes; ++j) h[n * kLanes + j] = (state && j < k.width) ? state[(k.e0 + j) * p.N + n] : 0.0f;
}

inline void store_state(const float* __restrict h, const Scan& p, const Block& k, float* state) {
    for (int64_t j = 0; j < k.width; ++j)
        for (int64_t n = 0; n < p.N; ++n) state[(k.e0 + j) * p.N + n] = h[n * kLanes + j];
}

// A^T for the block: At[n][j] = A[e0 + j, n] (zeros past the width).
inline void load_decay_rates(const Scan& p, const Block& k, float* __restrict At) {
    for (int64_t n = 0; n < p.N; ++n)
        for (int64_t j = 0; j < kLanes; ++j) At[n * kLanes + j] = j < k.width ? p.A[(k.e0 + j) * p.N + n] : 0.0f;
}

// One step t: h = a h + dt u B_t with a = exp(dt A), into h_next (h itself forward); y_t into y (if given), a
// into `a` (if keep_decays).
template <bool keep_decays>
inline void step(const Scan& p, const Block& k, int64_t t, const float* __restrict At, const float* h,
                 float* h_next, float* __restrict a, float* __restrict y) {
    const int64_t row = k.b * p.T + t;
    const float kept = (p.starts && p.starts[row]) ? 0.0f : 1.0f;  // a document starts at t: a_t = 0
    float d[kLanes], x[kLanes], acc[kLanes] = {};
    load_lanes(p.dt + row * p.E, k, d);
    load_lanes(p.u + row * p.E, k, x);
    const float *Bt = p.B + row * p.N, *Ct = p.C + row * p.N;
    for (int64_t n = 0; n < p.N; ++n) {
        const float bn = Bt[n], cn = Ct[n];
        const float* hn = h + n * kLanes;  // may be out: each lane reads its own value before writing it
        float* out = h_next + n * kLanes;
        const float* __restrict rate = At + n * kLanes;
        XLSTM_ZOO_SIMD
        for (int64_t j = 0; j < kLanes; ++j) {
            const float decay = kept * vexp(d[j] * rate[j]);
            const float next = decay * hn[j] + d[j] * x[j] * bn;
            out[j] = next;
            acc[j] += cn * next;
            if (keep_decays) a[n * kLanes + j] = decay;
        }
    }
    if (y)
        for (int64_t j = 0; j < k.width; ++j) y[row * p.E + k.e0 + j] = acc[j];
}

// Per-thread buffers of the forward: the block's state and A^T, [N][kLanes] each.
struct ForwardBuffers {
    std::vector<float> h, At;
    explicit ForwardBuffers(const Scan& p) : h(p.N * kLanes), At(p.N * kLanes) {}
};

void forward_block(const Scan& p, const Block& k, float* y, float* h_final, float* checkpoints, ForwardBuffers& w) {
    float *h = w.h.data(), *At = w.At.data();
    load_decay_rates(p, k, At);
    load_state(p.h0 + k.b * p.E * p.N, p, k, h);
    for (int64_t t = 0; t < p.T; ++t) {
        if (checkpoints && t % p.chunk == 0)
            store_state(h, p, k, checkpoints + (k.b * p.chunks() + t / p.chunk) * p.E * p.N);
        step<false>(p, k, t, At, h, h, nullptr, y);
    }
    store_state(h, p, k, h_final + k.b * p.E * p.N);
}

// The gradients' destinations. dB and dC point at the unit's group's partial sums ([B, T, N] per group),
// dA at the sequence's partial sum ([B, E, N]).
struct Grads {
    const float *dy, *dh_final;
    float *du, *ddt, *dA, *dB, *dC, *dh0;
};

// Per-thread buffers of the backward: a chunk's states (chunk + 1 of them) and decays, the block's A^T,
// the state's gradient g and dA's running sum, all [N][kLanes].
struct BackwardBuffers {
    std::vector<float> h, a, At, g, dA;
    explicit BackwardBuffers(const Scan& p)
        : h((p.chunk + 1) * p.N * kLanes), a(p.chunk * p.N * kLanes), At(p.N * kLanes), g(p.N * kLanes),
          dA(p.N * kLanes) {}
};

// Step t in reverse: the state's gradient g (dL/dh_t without the output's part on entry; dL/dh_{t-1} on
// exit), h_prev = h_{t-1}, h = h_t, a = a_t.
inline void reverse_step(const Scan& p, const Block& k, int64_t t, const float* __restrict At,
                         const float* __restrict h_prev, const float* __restrict h, const float* __restrict a,
                         float* __restrict g, float* __restrict dA, const Grads& out) {
    const int64_t row = k.b * p.T + t;
    float d[kLanes], x[kLanes], dy[kLanes], du[kLanes] = {}, ddt[kLanes] = {};
    load_lanes(p.dt + row * p.E, k, d);
    load_lanes(p.u + row * p.E, k, x);
    load_lanes(out.dy + row * p.E, k, dy);
    const float* Bt = p.B + row * p.N;
    const float* Ct = p.C + row * p.N;
    float *dBt = out.dB + row * p.N, *dCt = out.dC + row * p.N;
    for (int64_t n = 0; n < p.N; ++n) {
        const int64_t at = n * kLanes;
        const float bn = Bt[n], cn = Ct[n];
        float dc = 0.0f, db = 0.0f;
        XLSTM_ZOO_SIMD_REDUCE_TWO(+ : dc, + : db)
        for (int64_t j = 0; j < kLanes; ++j) {
            const float gj = g[at + j] + dy[j] * cn;          // dL/dh_t
            const float q = gj * h_prev[at + j] * a[at + j];  // dL/d(dt A), the decay's exponent
            dc += dy[j] * h[at + j];
            db += gj * d[j] * x[j];
            du[j] += gj * bn;
            ddt[j] += gj * x[j] * bn + q * At[at + j];
            dA[at + j] += q * d[j];
            g[at + j] = gj * a[at + j];                       // dL/dh_{t-1}
        }
        dCt[n] += dc;
        dBt[n] += db;
    }
    for (int64_t j = 0; j < k.width; ++j) {
        out.du[row * p.E + k.e0 + j] = du[j] * d[j];
        out.ddt[row * p.E + k.e0 + j] = ddt[j];
    }
}

void backward_block(const Scan& p, const Block& k, const float* checkpoints, const Grads& out, BackwardBuffers& w) {
    const int64_t S = p.N * kLanes;
    load_decay_rates(p, k, w.At.data());
    load_state(out.dh_final ? out.dh_final + k.b * p.E * p.N : nullptr, p, k, w.g.data());
    std::fill(w.dA.begin(), w.dA.end(), 0.0f);
    for (int64_t c = p.chunks() - 1; c >= 0; --c) {
        const int64_t t0 = c * p.chunk, steps = std::min(p.T, t0 + p.chunk) - t0;
        load_state(checkpoints + (k.b * p.chunks() + c) * p.E * p.N, p, k, w.h.data());
        for (int64_t i = 0; i < steps; ++i)  // the chunk's states and decays again
            step<true>(p, k, t0 + i, w.At.data(), w.h.data() + i * S, w.h.data() + (i + 1) * S, w.a.data() + i * S, nullptr);
        for (int64_t i = steps - 1; i >= 0; --i)
            reverse_step(p, k, t0 + i, w.At.data(), w.h.data() + i * S, w.h.data() + (i + 1) * S, w.a.data() + i * S,
                         w.g.data(), w.dA.data(), out);
    }
    store_state(w.g.data(), p, k, out.dh0 + k.b * p.E * p.N);
    store_state(w.dA.data(), p, k, out.dA + k.b * p.E * p.N);
}

// body(worker buffers, block) for every block of every (sequence, channel group) unit, units over threads.
template <typename Buffers, typename Body>
void over_units(const Scan& p, int64_t threads, const Body& body) {
    if (p.batch * p.T * p.E * p.N < kMinUpdatesForThreads) threads = 1;
    parallel_rows(p.batch * p.groups(), threads, [&]() {
        return [&, buffers = Buffers(p)](int64_t unit) mutable {
            const int64_t b = unit / p.groups(), g = unit % p.groups();
            for (int64_t e0 = g * kGroup; e0 < std::min(p.E, (g + 1) * kGroup); e0 += kLanes)
                body(buffers, Block{b, e0, std::min(kLanes, p.E - e0)}, g);
        };
    });
}

}  // namespace

// checkpoints: null (no backward to come), else [B, ceil(T / chunk), E, N] receives the state at the start of
// every chunk.
extern "C" void xlstm_zoo_selective_scan_forward_f32(const float* u, const float* dt, const float* A, const float* B,
                                                     const float* C, const float* h0, float* y, float* h_final,
                                                     float* checkpoints, const uint8_t* starts, int64_t batch,
                                                     int64_t T, int64_t E, int64_t N, int64_t chunk,
                                                     int64_t threads) {
    const Scan p{u, dt, A, B, C, h0, starts, batch, T, E, N, chunk};
    over_units<ForwardBuffers>(p, threads, [&](ForwardBuffers& w, const Block& k, int64_t) {
        forward_block(p, k, y, h_final, checkpoints, w);
    });
}

// dh_final may be null (no gradient reaches the final state). partials: scratch of 2 G B T N + B E N floats,
// G = ceil(E / 64) channel groups.
extern "C" void xlstm_zoo_selective_scan_backward_f32(const float* u, const float* dt, const float* A, const float* B,
                                                      const float* C, const float* checkpoints, const float* dy,
                                                      const float* dh_final, float* du, float* ddt, float* dA,
                                                      float* dB, float* dC, float* dh0, float* partials,
                                                      const uint8_t* starts, int64_t batch, int64_t T, int64_t E,
                                                      int64_t N, int64_t chunk, int64_t threads) {
    const Scan p{u, dt, A, B, C, nullptr, starts, batch, T, E, N, chunk};
    const int64_t G = p.groups(), slab = batch * T * N;
    float *dB_groups = partials, *dC_groups = partials + G * slab, *dA_rows = partials + 2 * G * slab;
    std::fill(partials, partials + 2 * G * slab, 0.0f);
    over_units<BackwardBuffers>(p, threads, [&](BackwardBuffers& w, const Block& k, int64_t g) {
        const Grads out{dy, dh_final, du, ddt, dA_rows, dB_groups + g * slab, dC_groups + g * slab, dh0};
        backward_block(p, k, checkpoints, out, w);
    });
    // The partial sums, in a fixed order: dB, dC over the channel groups, dA over the sequences.
    std::copy(dB_groups, dB_groups + slab, dB);
    std::copy(dC_groups, dC_groups + slab, dC);
    for (int64_t g = 1; g < G; ++g) {
        XLSTM_ZOO_SIMD
        for (int64_t i = 0; i < slab; ++i) {
            dB[i] += dB_groups[g * slab + i];
            dC[i] += dC_groups[g * slab + i];
        }
    }
    std::copy(dA_rows, dA_rows + E * N, dA);
    for (int64_t b = 1; b < batch; ++b) {
        XLSTM_ZOO_SIMD
        for (int64_t i = 0; i < E * N; ++i) dA[i] += dA_rows[b * E * N + i];
    }
}
