// sLSTM recurrence on the CPU, forward and backward: each whole time loop in C++, no torch headers (built
// in about a second with the system compiler, loaded with ctypes). Same maths as backends/reference/slstm.py;
// the backward is the exact derivative that backends/fused/slstm.py (slstm_backward) writes in PyTorch.
//
// Every (head, batch) row is an independent recurrence: its state, its slice of W x and its head's
// recurrent matrix R[h] (D x 4D). The row loops take disjoint sets of rows per thread and run the whole
// sequence for each, one matrix-vector product per token. The float32 loops for 4 rows or more and heads of
// 16 units or more (the batched section below) take one token for all rows at once instead, as one small
// matrix product per head, so R is read once per token, not once per row.
//
// Layout (row-major, time-major as in backends/fused/time_major.py):
//   W, G   [T, H, B, 4D]   W x + b in, pre-activations out (G = W + h_prev R), gate order i, f, z, o
//   R      [H, D, 4D]
//   c0 n0 m0 h0  [H, B, D]
//   C, N   [T+1, ..., D] with `cn_step` elements between tokens (c and n may share one stacked buffer)
//   M, Hs  [T+1, H, B, D]   index 0 receives the initial state
//   starts [B, T] (bytes; null: none)  1 where a document starts: that token enters from the zero state
//                            (c = n = h = 0, m = -inf); the stored states stay those after each token
// Backward, in addition:
//   Rt     [H, 4D, D]        R transposed, so dh_prev = dG R^T is an axpy that vectorises
//   dH     [T, H, B, D]      gradient of every output h (null: zeros)
//   dcT dnT dmT dhT [H, B, D] gradients of the final state (each null: zeros)
//   dG     [T, H, B, 4D]     out: gradients of the pre-activations (= of W x + b); dR is one matmul in Python
//   dc0 dn0 dm0 dh0 [H, B, D] out: gradients of the initial state

#include <type_traits>

#include "loops.h"
#include "unit_team.h"

XLSTM_ZOO_WIDE_VECTORS

namespace {

using namespace xlstm_zoo;

template <typename T>
struct Problem {
    const T *W, *R, *c0, *n0, *m0, *h0;
    T *G, *C, *N, *M, *Hs;
    const uint8_t* starts;
    int64_t steps, heads, batch, dim, cn_step;

    bool restarts(int64_t row, int64_t t) const { return starts && starts[(row % batch) * steps + t]; }
};

// One token's cell, units [j0, j1) of one row: the state after the token from the pre-activations g (= W x + b +
// h_prev R) and the state before. The row loops call it for every unit, the batched loops for a thread's units.
// The gate schemes are template arguments, so each loop holds only the maths its scheme needs.
template <typename T, bool input_exp, bool forget_exp>
inline void cell_forward(const T* __restrict g, const T* __restrict c_prev, const T* __restrict n_prev,
                         const T* __restrict m_prev, T* __restrict c, T* __restrict n, T* __restrict m,
                         T* __restrict h, int64_t D, int64_t j0, int64_t j1) {
    XLSTM_ZOO_SIMD
    for (int64_t j = j0; j < j1; ++j) {
        const T log_i = log_gate<T, input_exp>(g[j]);
        const T a = log_gate<T, forget_exp>(g[D + j]) + m_prev[j];  // log f + m_prev
        const T m_new = nan_max(a, log_i);
        const T f_s = vexp(a - m_new), i_s = vexp(log_i - m_new);
        const T c_new = f_s * c_prev[j] + i_s * vtanh(g[2 * D + j]);
        const T n_new = f_s * n_prev[j] + i_s;
        c[j] = c_new; n[j] = n_new; m[j] = m_new;
        h[j] = c_new / n_new * sigmoid(g[3 * D + j]);
    }
}

// Its backward, units [j0, j1): dg, the gradient of g, from the gradient of this token's h (the carried dh_rec plus
// the output's dh_out) and the carried dc, dn, dm, which become those of the state before. Every pointwise factor
// is recomputed from g and the saved states (cheaper than reading them from memory), and the gradient of the
// stabiliser m is kept exactly: torch.maximum's ties give half to each side.
template <typename T, bool input_exp, bool forget_exp>
inline void cell_backward(const T* __restrict g, const T* __restrict c, const T* __restrict n,
                          const T* __restrict m, const T* __restrict c_prev, const T* __restrict n_prev,
                          const T* __restrict m_prev, const T* __restrict dh_rec, const T* __restrict dh_out,
                          T* __restrict dg, T* __restrict dc, T* __restrict dn, T* __restrict dm, int64_t D,
                          int64_t j0, int64_t j1) {
    XLSTM_ZOO_SIMD
    for (int64_t j = j0; j < j1; ++j) {
        const T gi = g[j], gf = g[D + j];
        const T log_i = log_gate<T, input_exp>(gi), a = log_gate<T, forget_exp>(gf) + m_prev[j];
        const T f_s = vexp(a - m[j]), i_s = vexp(log_i - m[j]);
        const T z = vtanh(g[2 * D + j]), o = sigmoid(g[3 * D + j]), ratio = c[j] / n[j];
        const T dh = dh_rec[j] + dh_out[j];
        const T dct = dc[j] + dh * (o / n[j]);
        const T dnt = dn[j] - dh * (o * ratio / n[j]);
        const T dfs = (dct * c_prev[j] + dnt * n_prev[j]) * f_s;  // d(f') f'
        const T dis = (dnt + dct * z) * i_s;                      // d(i') i'
        const T dm_total = dm[j] - dfs - dis;                      // m's own gradient
        // 1, 1/2 or 0 (and 0 for NaN): written as a sum, as a nested select stopped gcc vectorising the loop
        const T to_a = T(0.5) * (T(a >= log_i) + T(a > log_i));
        const T da = dfs + dm_total * to_a, dli = dis + dm_total * (T(1) - to_a);
        dg[j] = input_exp ? dli : dli * sigmoid(-gi);
        dg[D + j] = forget_exp ? da : da * sigmoid(-gf);
        dg[2 * D + j] = dct * (i_s * (T(1) - z * z));
        dg[3 * D + j] = dh * (ratio * (o * (T(1) - o)));
        dc[j] = dct * f_s; dn[j] = dnt * f_s; dm[j] = da;
    }
}

// The loops pass the zero state (c = n = h = 0, m = -inf) as the state before a token that starts a document: a
// pointer each, chosen per token, so the unit loops hold no select (which stopped gcc vectorising them).
template <typename T>
struct ZeroState {
    explicit ZeroState(int64_t D) : zeros(D, T(0)), empty_m(D, -std::numeric_limits<T>::infinity()) {}
    std::vector<T> zeros, empty_m;
};

template <typename T, bool input_exp, bool forget_exp>
void forward_rows(const Problem<T>& p, int64_t row_begin, int64_t row_end) {
    const int64_t D = p.dim, D4 = 4 * D, rows = p.heads * p.batch;
    const ZeroState<T> zero(D);
    const T *z = zero.zeros.data(), *no_m = zero.empty_m.data();
    for (int64_t row = row_begin; row < row_end; ++row) {
        const T* R = p.R + (row / p.batch) * D * D4;
        std::copy(p.c0 + row * D, p.c0 + (row + 1) * D, p.C + row * D);
        std::copy(p.n0 + row * D, p.n0 + (row + 1) * D, p.N + row * D);
        std::copy(p.m0 + row * D, p.m0 + (row + 1) * D, p.M + row * D);
        std::copy(p.h0 + row * D, p.h0 + (row + 1) * D, p.Hs + row * D);
        for (int64_t t = 0; t < p.steps; ++t) {
            const bool restart = p.restarts(row, t);
            const int64_t cn = t * p.cn_step + row * D, at = (t * rows + row) * D, next = at + rows * D;
            T* g = p.G + (t * rows + row) * D4;
            preactivations(g, p.W + (t * rows + row) * D4, restart ? z : p.Hs + at, R, D);
            cell_forward<T, input_exp, forget_exp>(g, restart ? z : p.C + cn, restart ? z : p.N + cn,
                                                   restart ? no_m : p.M + at, p.C + cn + p.cn_step,
                                                   p.N + cn + p.cn_step, p.M + next, p.Hs + next, D, 0, D);
        }
    }
}

template <typename T>
struct Gradients {
    const T *G, *Rt, *C, *N, *M, *dH, *dcT, *dnT, *dmT, *dhT;
    T *dG, *dc0, *dn0, *dm0, *dh0;
    const uint8_t* starts;
    int64_t steps, heads, batch, dim, cn_step;

    bool restarts(int64_t row, int64_t t) const { return starts && starts[(row % batch) * steps + t]; }
};

// Backward through one row's whole sequence, last token first. At a document start f' = 0, so no gradient goes
// further back through c, n and m; h's is cut here.
template <typename T, bool input_exp, bool forget_exp>
void backward_rows(const Gradients<T>& p, int64_t row_begin, int64_t row_end) {
    const int64_t D = p.dim, D4 = 4 * D, rows = p.heads * p.batch;
    std::vector<T> dc_buf(D), dn_buf(D), dm_buf(D), dh_buf(D);
    T *dc = dc_buf.data(), *dn = dn_buf.data(), *dm = dm_buf.data(), *dh_rec = dh_buf.data();
    const ZeroState<T> zero(D);
    const T *z = zero.zeros.data(), *no_m = zero.empty_m.data();
    for (int64_t row = row_begin; row < row_end; ++row) {
        const T* Rt = p.Rt + (row / p.batch) * D4 * D;
        load_row(dc, p.dcT, row, D); load_row(dn, p.dnT, row, D);
        load_row(dm, p.dmT, row, D); load_row(dh_rec, p.dhT, row, D);
        for (int64_t t = p.steps - 1; t >= 0; --t) {
            const bool restart = p.restarts(row, t);
            const int64_t cn = (t + 1) * p.cn_step + row * D, at = ((t + 1) * rows + row) * D;
            const T *c = p.C + cn, *n = p.N + cn, *m = p.M + at;
            T* dg = p.dG + (t * rows + row) * D4;
            cell_backward<T, input_exp, forget_exp>(
                p.G + (t * rows + row) * D4, c, n, m, restart ? z : c - p.cn_step, restart ? z : n - p.cn_step,
                restart ? no_m : m - rows * D, dh_rec, p.dH ? p.dH + (t * rows + row) * D : z, dg, dc, dn, dm, D, 0, D);
            if (restart) std::fill(dh_rec, dh_rec + D, T(0));
            else recurrent_input_grad(dh_rec, dg, Rt, D);
        }
        std::copy(dc, dc + D, p.dc0 + row * D); std::copy(dn, dn + D, p.dn0 + row * D);
        std::copy(dm, dm + D, p.dm0 + row * D); std::copy(dh_rec, dh_rec + D, p.dh0 + row * D);
    }
}

// ---- float32: all batch rows per token, units split over threads (unit_team.h) ---------------------------
// As lstm_loop.cpp's batched loops: per token and head one product G = W + h_prev R for all batch rows (R read
// once per token, not once per row), then each thread's units' cell update.

template <bool input_exp, bool forget_exp>
void forward_batched(const Problem<float>& p, int64_t threads) {
    const int64_t D = p.dim, D4 = 4 * D, H = p.heads, B = p.batch, rows = H * B;
    const ZeroState<float> zero(D);
    const float *z = zero.zeros.data(), *no_m = zero.empty_m.data();
    std::copy(p.c0, p.c0 + rows * D, p.C);
    std::copy(p.n0, p.n0 + rows * D, p.N);
    std::copy(p.m0, p.m0 + rows * D, p.M);
    std::copy(p.h0, p.h0 + rows * D, p.Hs);
    team(batched_threads(H, B, D, threads), [&](int index, int count, const TeamBarrier& barrier) {
        int64_t j0, j1;
        owned_units(D, index, count, j0, j1);
        for (int64_t t = 0; t < p.steps; ++t) {
            for (int64_t h = 0; h < H; ++h) {
                const int64_t at = (t * H + h) * B;  // row (t, h, b = 0) of W, G, M and Hs
                float* G = p.G + at * D4;
                const float *W = p.W + at * D4, *R = p.R + h * D * D4;
                unit_preactivations(B, D, j0, j1, p.Hs + at * D, R, W, G, [&](int64_t b) { return p.restarts(b, t); });
                for (int64_t b = 0; b < B; ++b) {
                    const int64_t row = h * B + b;
                    const bool restart = p.restarts(b, t);
                    const int64_t cn = t * p.cn_step + row * D, at_b = (at + b) * D, next = at_b + rows * D;
                    cell_forward<float, input_exp, forget_exp>(
                        G + b * D4, restart ? z : p.C + cn, restart ? z : p.N + cn, restart ? no_m : p.M + at_b,
                        p.C + cn + p.cn_step, p.N + cn + p.cn_step, p.M + next, p.Hs + next, D, j0, j1);
                }
            }
            barrier.wait();  // h_{t+1} complete before any thread's next product reads it
        }
    });
}

template <bool input_exp, bool forget_exp>
void backward_batched(const Gradients<float>& p, int64_t threads) {
    const int64_t D = p.dim, D4 = 4 * D, H = p.heads, B = p.batch, rows = H * B;
    // Per (head, row): the carried gradients of c, n, m and of h through the recurrence.
    std::vector<float> dc_buf(rows * D), dn_buf(rows * D), dm_buf(rows * D), dh_buf(rows * D);
    float *dc = dc_buf.data(), *dn = dn_buf.data(), *dm = dm_buf.data(), *dh_rec = dh_buf.data();
    for (int64_t r = 0; r < rows; ++r) {
        load_row(dc + r * D, p.dcT, r, D); load_row(dn + r * D, p.dnT, r, D);
        load_row(dm + r * D, p.dmT, r, D); load_row(dh_rec + r * D, p.dhT, r, D);
    }
    const ZeroState<float> zero(D);
    const float *z = zero.zeros.data(), *no_m = zero.empty_m.data();
    team(batched_threads(H, B, D, threads), [&](int index, int count, const TeamBarrier& barrier) {
        int64_t j0, j1;
        owned_units(D, index, count, j0, j1);
        for (int64_t t = p.steps - 1; t >= 0; --t) {
            for (int64_t h = 0; h < H; ++h) {
                const int64_t at = (t * H + h) * B;
                for (int64_t b = 0; b < B; ++b) {
                    const int64_t r = h * B + b;
                    const bool restart = p.restarts(b, t);
                    const int64_t cn = (t + 1) * p.cn_step + r * D, at_b = (at + rows + b) * D;
                    const float *c = p.C + cn, *n = p.N + cn, *m = p.M + at_b;
                    cell_backward<float, input_exp, forget_exp>(
                        p.G + (at + b) * D4, c, n, m, restart ? z : c - p.cn_step, restart ? z : n - p.cn_step,
                        restart ? no_m : m - rows * D, dh_rec + r * D, p.dH ? p.dH + (at + b) * D : z,
                        p.dG + (at + b) * D4, dc + r * D, dn + r * D, dm + r * D, D, j0, j1);
                }
            }
            barrier.wait();  // every unit's dG_t complete before the products below read all of it
            for (int64_t h = 0; h < H; ++h) {
                const int64_t at = (t * H + h) * B;
                unit_recurrent_grad(B, D, j0, j1, p.dG + at * D4, p.Rt + h * D4 * D, dh_rec + h * B * D,
                                    [&](int64_t b) { return p.restarts(b, t); });
            }
            // No barrier here: the next token writes dG_{t-1}, and each thread reads only its own units' carries.
        }
    });
    std::copy(dc, dc + rows * D, p.dc0); std::copy(dn, dn + rows * D, p.dn0);
    std::copy(dm, dm + rows * D, p.dm0); std::copy(dh_rec, dh_rec + rows * D, p.dh0);
}

// The batched loops for float32 heads of at least one unit block and batches of 4 rows or more; the row loops
// otherwise: float64 (gradcheck), narrower heads, and 1-2 rows, where a matrix-vector loop per row beats a
// product of so few rows (one thread, AMD EPYC, fwd+bwd: B=1 T=512 H=2 D=32 1.7-2.5 vs 2.5-3.0 ms; B=4
// T=1024 H=4 D=32 25 vs 78 ms; B=256 T=22 D=64 17 vs 29 ms).
constexpr int64_t kMinBatchedRows = 4;

inline bool batched(int64_t dim, int64_t batch) { return dim >= kUnitBlock && batch >= kMinBatchedRows; }

// f(input_exp, forget_exp) with the gate schemes as std::bool_constant, so each loop holds only its scheme's maths.
template <typename F>
void with_gates(bool input_exp, bool forget_exp, const F& f) {
    if (input_exp) forget_exp ? f(std::true_type{}, std::true_type{}) : f(std::true_type{}, std::false_type{});
    else forget_exp ? f(std::false_type{}, std::true_type{}) : f(std::false_type{}, std::false_type{});
}

template <typename T>
void forward(const Problem<T>& p, bool input_exp, bool forget_exp, int64_t threads) {
    with_gates(input_exp, forget_exp, [&](auto ie, auto fe) {
        if constexpr (std::is_same_v<T, float>)
            if (batched(p.dim, p.batch)) return forward_batched<ie, fe>(p, threads);
        run(p, forward_rows<T, ie, fe>, threads);
    });
}

template <typename T>
void backward(const Gradients<T>& p, bool input_exp, bool forget_exp, int64_t threads) {
    with_gates(input_exp, forget_exp, [&](auto ie, auto fe) {
        if constexpr (std::is_same_v<T, float>)
            if (batched(p.dim, p.batch)) return backward_batched<ie, fe>(p, threads);
        run(p, backward_rows<T, ie, fe>, threads);
    });
}

}  // namespace

#define XLSTM_ZOO_SLSTM_FORWARD(NAME, T)                                                                  \
    extern "C" void NAME(const T* W, const T* R, const T* c0, const T* n0, const T* m0, const T* h0, T* G, \
                         T* C, T* N, T* M, T* Hs, const uint8_t* starts, int64_t steps, int64_t heads,      \
                         int64_t batch, int64_t dim, int64_t cn_step, int input_exp, int forget_exp,         \
                         int64_t threads) {                                                                 \
        forward(Problem<T>{W, R, c0, n0, m0, h0, G, C, N, M, Hs, starts, steps, heads, batch, dim, cn_step},  \
                input_exp != 0, forget_exp != 0, threads);                                                  \
    }

#define XLSTM_ZOO_SLSTM_BACKWARD(NAME, T)                                                                   \
    extern "C" void NAME(const T* G, const T* Rt, const T* C, const T* N, const T* M, const T* dH,          \
                         const T* dcT, const T* dnT, const T* dmT, const T* dhT, T* dG, T* dc0, T* dn0,      \
                         T* dm0, T* dh0, const uint8_t* starts, int64_t steps, int64_t heads, int64_t batch, \
                         int64_t dim, int64_t cn_step, int input_exp, int forget_exp, int64_t threads) {     \
        backward(Gradients<T>{G, Rt, C, N, M, dH, dcT, dnT, dmT, dhT, dG, dc0, dn0, dm0, dh0, starts, steps,  \
                              heads, batch, dim, cn_step},                                                  \
                 input_exp != 0, forget_exp != 0, threads);                                                 \
    }

XLSTM_ZOO_SLSTM_FORWARD(xlstm_zoo_slstm_forward_f32, float)
XLSTM_ZOO_SLSTM_FORWARD(xlstm_zoo_slstm_forward_f64, double)
XLSTM_ZOO_SLSTM_BACKWARD(xlstm_zoo_slstm_backward_f32, float)
XLSTM_ZOO_SLSTM_BACKWARD(xlstm_zoo_slstm_backward_f64, double)
