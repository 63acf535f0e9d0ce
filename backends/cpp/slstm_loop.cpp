// sLSTM recurrence on the CPU, forward and backward: each whole time loop in C++, no torch headers (built
// in about a second with the system compiler, loaded with ctypes). Same maths as backends/reference/slstm.py;
// the backward is the exact derivative that backends/fused/slstm.py (slstm_backward) writes in PyTorch.
//
// Every (head, batch) row is an independent recurrence: its state, its slice of W x and its head's
// recurrent matrix R[h] (D x 4D, a few KiB, stays in L1). Threads take disjoint sets of rows and run the
// whole sequence for each, so there is one thread launch per call, not one per token.
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

#include "loops.h"

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
                const T to_a = a > log_i ? T(1) : (a == log_i ? T(0.5) : T(0));
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

template <typename T, bool ie, bool fe>
struct Forward { static void call(const Problem<T>& p, int64_t a, int64_t b) { forward_rows<T, ie, fe>(p, a, b); } };
template <typename T, bool ie, bool fe>
struct Backward { static void call(const Gradients<T>& p, int64_t a, int64_t b) { backward_rows<T, ie, fe>(p, a, b); } };

// The row function for a gate scheme: {sigmoid, exponential} input x {sigmoid, exponential} forget.
template <typename P, template <typename, bool, bool> class Rows, typename T>
auto for_gates(bool input_exp, bool forget_exp) -> void (*)(const P&, int64_t, int64_t) {
    if (input_exp) return forget_exp ? Rows<T, true, true>::call : Rows<T, true, false>::call;
    return forget_exp ? Rows<T, false, true>::call : Rows<T, false, false>::call;
}

}  // namespace

#define XLSTM_ZOO_SLSTM_FORWARD(NAME, T)                                                                  \
    extern "C" void NAME(const T* W, const T* R, const T* c0, const T* n0, const T* m0, const T* h0, T* G, \
                         T* C, T* N, T* M, T* Hs, const uint8_t* starts, int64_t steps, int64_t heads,      \
                         int64_t batch, int64_t dim, int64_t cn_step, int input_exp, int forget_exp,         \
                         int64_t threads) {                                                                 \
        run(Problem<T>{W, R, c0, n0, m0, h0, G, C, N, M, Hs, starts, steps, heads, batch, dim, cn_step},    \
            for_gates<Problem<T>, Forward, T>(input_exp != 0, forget_exp != 0), threads);                  \
    }

#define XLSTM_ZOO_SLSTM_BACKWARD(NAME, T)                                                                   \
    extern "C" void NAME(const T* G, const T* Rt, const T* C, const T* N, const T* M, const T* dH,          \
                         const T* dcT, const T* dnT, const T* dmT, const T* dhT, T* dG, T* dc0, T* dn0,      \
                         T* dm0, T* dh0, const uint8_t* starts, int64_t steps, int64_t heads, int64_t batch, \
                         int64_t dim, int64_t cn_step, int input_exp, int forget_exp, int64_t threads) {     \
        run(Gradients<T>{G, Rt, C, N, M, dH, dcT, dnT, dmT, dhT, dG, dc0, dn0, dm0, dh0, starts, steps,     \
                         heads, batch, dim, cn_step},                                                       \
            for_gates<Gradients<T>, Backward, T>(input_exp != 0, forget_exp != 0), threads);              \
    }

XLSTM_ZOO_SLSTM_FORWARD(xlstm_zoo_slstm_forward_f32, float)
XLSTM_ZOO_SLSTM_FORWARD(xlstm_zoo_slstm_forward_f64, double)
XLSTM_ZOO_SLSTM_BACKWARD(xlstm_zoo_slstm_backward_f32, float)
XLSTM_ZOO_SLSTM_BACKWARD(xlstm_zoo_slstm_backward_f64, double)
