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

#include "block_gemm.h"
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

// The gate schemes are template arguments, so each unit loop holds only the maths its scheme needs.
template <typename T, bool input_exp, bool forget_exp>
void forward_rows(const Problem<T>& p, int64_t row_begin, int64_t row_end) {
    const int64_t D = p.dim, D4 = 4 * D, rows = p.heads * p.batch;
    std::vector<T> g_buf(D4), h_buf(D), c_buf(D), n_buf(D), m_buf(D);
    T *__restrict g = g_buf.data(), *__restrict h = h_buf.data(), *__restrict c = c_buf.data(),
      *__restrict n = n_buf.data(), *__restrict m = m_buf.data();
    for (int64_t row = row_begin; row < row_end; ++row) {
        const int64_t head = row / p.batch;
        const T* R = p.R + head * D * D4;
        for (int64_t j = 0; j < D; ++j) {
            c[j] = p.c0[row * D + j]; n[j] = p.n0[row * D + j];
            m[j] = p.m0[row * D + j]; h[j] = p.h0[row * D + j];
            p.C[row * D + j] = c[j]; p.N[row * D + j] = n[j];
            p.M[row * D + j] = m[j]; p.Hs[row * D + j] = h[j];
        }
        for (int64_t t = 0; t < p.steps; ++t) {
            if (p.restarts(row, t)) {
                std::fill(c, c + D, T(0)); std::fill(n, n + D, T(0)); std::fill(h, h + D, T(0));
                std::fill(m, m + D, -std::numeric_limits<T>::infinity());
            }
            preactivations(g, p.W + (t * rows + row) * D4, h, R, D);
            std::copy(g, g + D4, p.G + (t * rows + row) * D4);
            XLSTM_ZOO_SIMD
            for (int64_t j = 0; j < D; ++j) {
                const T log_i = log_gate<T, input_exp>(g[j]);
                const T a = log_gate<T, forget_exp>(g[D + j]) + m[j];  // log f + m_prev
                const T m_new = nan_max(a, log_i);
                const T f_s = vexp(a - m_new), i_s = vexp(log_i - m_new);
                c[j] = f_s * c[j] + i_s * vtanh(g[2 * D + j]);
                n[j] = f_s * n[j] + i_s;
                m[j] = m_new;
                h[j] = c[j] / n[j] * sigmoid(g[3 * D + j]);
            }
            const int64_t cn = (t + 1) * p.cn_step + row * D, s = ((t + 1) * rows + row) * D;
            std::copy(c, c + D, p.C + cn);
            std::copy(n, n + D, p.N + cn);
            std::copy(m, m + D, p.M + s);
            std::copy(h, h + D, p.Hs + s);
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

// Backward through one row's whole sequence, last token first. Every pointwise factor is recomputed
// from the saved pre-activations and states (cheaper than reading them from memory), and the
// gradient of the stabiliser m is kept exactly: torch.maximum's ties give half to each side.
template <typename T, bool input_exp, bool forget_exp>
void backward_rows(const Gradients<T>& p, int64_t row_begin, int64_t row_end) {
    const int64_t D = p.dim, D4 = 4 * D, rows = p.heads * p.batch;
    std::vector<T> dc_buf(D), dn_buf(D), dm_buf(D), dh_buf(D), dg_buf(D4);
    T *__restrict dc = dc_buf.data(), *__restrict dn = dn_buf.data(), *__restrict dm = dm_buf.data(),
      *__restrict dh_rec = dh_buf.data(), *__restrict dg = dg_buf.data();
    // The zero state, entering a token that starts a document: f' = 0 there, so no gradient goes further back
    // through c, n and m; h's is cut below.
    const std::vector<T> zeros(D, T(0)), empty_m(D, -std::numeric_limits<T>::infinity());
    for (int64_t row = row_begin; row < row_end; ++row) {
        const T* Rt = p.Rt + (row / p.batch) * D4 * D;
        load_row(dc, p.dcT, row, D); load_row(dn, p.dnT, row, D);
        load_row(dm, p.dmT, row, D); load_row(dh_rec, p.dhT, row, D);
        for (int64_t t = p.steps - 1; t >= 0; --t) {
            if (p.dH) {
                const T* dh_out = p.dH + (t * rows + row) * D;
                for (int64_t j = 0; j < D; ++j) dh_rec[j] += dh_out[j];  // dh of this token's h, all paths
            }
            const bool restart = p.restarts(row, t);
            const T *__restrict g = p.G + (t * rows + row) * D4;
            const T *__restrict c = p.C + (t + 1) * p.cn_step + row * D;
            const T *__restrict n = p.N + (t + 1) * p.cn_step + row * D;
            const T *__restrict m = p.M + ((t + 1) * rows + row) * D;
            const T *__restrict c_prev = restart ? zeros.data() : c - p.cn_step;
            const T *__restrict n_prev = restart ? zeros.data() : n - p.cn_step;
            const T *__restrict m_prev = restart ? empty_m.data() : m - rows * D;
            XLSTM_ZOO_SIMD
            for (int64_t j = 0; j < D; ++j) {
                const T gi = g[j], gf = g[D + j];
                const T log_i = log_gate<T, input_exp>(gi), a = log_gate<T, forget_exp>(gf) + m_prev[j];
                const T f_s = vexp(a - m[j]), i_s = vexp(log_i - m[j]);
                const T z = vtanh(g[2 * D + j]), o = sigmoid(g[3 * D + j]), ratio = c[j] / n[j];
                const T dh = dh_rec[j];
                const T dct = dc[j] + dh * (o / n[j]);
                const T dnt = dn[j] - dh * (o * ratio / n[j]);
                const T dfs = (dct * c_prev[j] + dnt * n_prev[j]) * f_s;  // d(f') f'
                const T dis = (dnt + dct * z) * i_s;                      // d(i') i'
                const T dm_total = dm[j] - dfs - dis;                      // m's own gradient
                // 1, 1/2 or 0 (and 0 for NaN): written as a sum, as the nested select stopped gcc vectorising the loop
                const T to_a = T(0.5) * (T(a >= log_i) + T(a > log_i));
                const T da = dfs + dm_total * to_a, dli = dis + dm_total * (T(1) - to_a);
                dg[j] = input_exp ? dli : dli * sigmoid(-gi);
                dg[D + j] = forget_exp ? da : da * sigmoid(-gf);
                dg[2 * D + j] = dct * (i_s * (T(1) - z * z));
                dg[3 * D + j] = dh * (ratio * (o * (T(1) - o)));
                dc[j] = dct * f_s; dn[j] = dnt * f_s; dm[j] = da;
            }
            std::copy(dg, dg + D4, p.dG + (t * rows + row) * D4);
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
    const std::vector<float> zeros(D, 0.0f), empty_m(D, -std::numeric_limits<float>::infinity());
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
                if (j1 > j0)
                    for (int gate = 0; gate < 4; ++gate) {  // G = W + h_prev R, W read in place
                        const int64_t col = gate * D + j0;
                        gemm_b_onto<false>(int(B), int(j1 - j0), int(D), p.Hs + at * D, int(D), R + col, int(D4),
                                           Addend{W + col, int(D4)}, G + col, int(D4));
                    }
                for (int64_t b = 0; b < B; ++b) {
                    const int64_t row = h * B + b;
                    const bool restart = p.restarts(b, t);
                    if (restart)  // h_prev = 0 there: G = W for this thread's units
                        for (int gate = 0; gate < 4; ++gate)
                            std::copy(W + b * D4 + gate * D + j0, W + b * D4 + gate * D + j1,
                                      G + b * D4 + gate * D + j0);
                    const float* __restrict g = G + b * D4;
                    // A document start enters from the zero state (c = n = 0, m = -inf).
                    const float *__restrict c_prev = restart ? zeros.data() : p.C + t * p.cn_step + row * D,
                                *__restrict n_prev = restart ? zeros.data() : p.N + t * p.cn_step + row * D,
                                *__restrict m_prev = restart ? empty_m.data() : p.M + (at + b) * D;
                    float *__restrict c = p.C + (t + 1) * p.cn_step + row * D,
                          *__restrict n = p.N + (t + 1) * p.cn_step + row * D,
                          *__restrict m = p.M + (at + rows + b) * D, *__restrict h_out = p.Hs + (at + rows + b) * D;
                    XLSTM_ZOO_SIMD
                    for (int64_t j = j0; j < j1; ++j) {  // the row loop's maths (forward_rows), on this thread's units
                        const float log_i = log_gate<float, input_exp>(g[j]);
                        const float a = log_gate<float, forget_exp>(g[D + j]) + m_prev[j];  // log f + m_prev
                        const float m_new = nan_max(a, log_i);
                        const float f_s = vexp(a - m_new), i_s = vexp(log_i - m_new);
                        const float c_new = f_s * c_prev[j] + i_s * vtanh(g[2 * D + j]);
                        const float n_new = f_s * n_prev[j] + i_s;
                        c[j] = c_new; n[j] = n_new; m[j] = m_new;
                        h_out[j] = c_new / n_new * sigmoid(g[3 * D + j]);
                    }
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
    const std::vector<float> zeros(D, 0.0f), empty_m(D, -std::numeric_limits<float>::infinity());
    team(batched_threads(H, B, D, threads), [&](int index, int count, const TeamBarrier& barrier) {
        int64_t j0, j1;
        owned_units(D, index, count, j0, j1);
        for (int64_t t = p.steps - 1; t >= 0; --t) {
            for (int64_t h = 0; h < H; ++h) {
                const int64_t at = (t * H + h) * B;
                for (int64_t b = 0; b < B; ++b) {
                    const int64_t r = h * B + b;
                    const bool restart = p.restarts(b, t);
                    const float *__restrict g = p.G + (at + b) * D4;
                    const float *__restrict c = p.C + (t + 1) * p.cn_step + r * D;
                    const float *__restrict n = p.N + (t + 1) * p.cn_step + r * D;
                    const float *__restrict m = p.M + (at + rows + b) * D;
                    const float *__restrict c_prev = restart ? zeros.data() : c - p.cn_step;
                    const float *__restrict n_prev = restart ? zeros.data() : n - p.cn_step;
                    const float *__restrict m_prev = restart ? empty_m.data() : m - rows * D;
                    const float* __restrict dh_out = p.dH ? p.dH + (at + b) * D : zeros.data();  // a select in the
                    float *__restrict dg = p.dG + (at + b) * D4, *__restrict dcr = dc + r * D,
                          *__restrict dnr = dn + r * D, *__restrict dmr = dm + r * D, *__restrict dhr = dh_rec + r * D;
                    XLSTM_ZOO_SIMD
                    for (int64_t j = j0; j < j1; ++j) {  // the row loop's maths (backward_rows), on this thread's units
                        const float gi = g[j], gf = g[D + j];
                        const float log_i = log_gate<float, input_exp>(gi);
                        const float a = log_gate<float, forget_exp>(gf) + m_prev[j];
                        const float f_s = vexp(a - m[j]), i_s = vexp(log_i - m[j]);
                        const float z = vtanh(g[2 * D + j]), o = sigmoid(g[3 * D + j]), ratio = c[j] / n[j];
                        const float dh = dhr[j] + dh_out[j];  // loop would stop gcc vectorising it
                        const float dct = dcr[j] + dh * (o / n[j]);
                        const float dnt = dnr[j] - dh * (o * ratio / n[j]);
                        const float dfs = (dct * c_prev[j] + dnt * n_prev[j]) * f_s;
                        const float dis = (dnt + dct * z) * i_s;
                        const float dm_total = dmr[j] - dfs - dis;
                        const float to_a = 0.5f * (float(a >= log_i) + float(a > log_i));
                        const float da = dfs + dm_total * to_a, dli = dis + dm_total * (1.0f - to_a);
                        dg[j] = input_exp ? dli : dli * sigmoid(-gi);
                        dg[D + j] = forget_exp ? da : da * sigmoid(-gf);
                        dg[2 * D + j] = dct * (i_s * (1.0f - z * z));
                        dg[3 * D + j] = dh * (ratio * (o * (1.0f - o)));
                        dcr[j] = dct * f_s; dnr[j] = dnt * f_s; dmr[j] = da;
                    }
                }
            }
            barrier.wait();  // every unit's dG_t complete before the products below read all of it
            for (int64_t h = 0; h < H; ++h) {
                const int64_t at = (t * H + h) * B;
                if (j1 > j0)  // dh_prev = dG_t R^T, this thread's units
                    gemm_b_plain<false>(int(B), int(j1 - j0), int(D4), p.dG + at * D4, int(D4), p.Rt + h * D4 * D + j0,
                                        int(D), dh_rec + h * B * D + j0, int(D), false);
                for (int64_t b = 0; b < B; ++b)  // nothing reaches the h before a document start
                    if (p.restarts(b, t)) std::fill(dh_rec + (h * B + b) * D + j0, dh_rec + (h * B + b) * D + j1, 0.0f);
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
