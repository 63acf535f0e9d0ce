// sLSTM forward recurrence on the CPU: the whole time loop in C++, no torch headers (built in about a
// second with the system compiler, loaded with ctypes). Same maths as backends/reference/slstm.py.
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

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

namespace {

template <typename T>
inline T log_sigmoid(T x) {
    // torch.nn.functional.softplus(x, beta=-1) (the fused backend's log sigmoid): linear below -20.
    return x < T(-20) ? x : -std::log1p(std::exp(-x));
}

template <typename T>
inline T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }

template <typename T>
inline T nan_max(T a, T b) {  // torch.maximum: NaN wins
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
    return a > b ? a : b;
}

template <typename T>
struct Problem {
    const T *W, *R, *c0, *n0, *m0, *h0;
    T *G, *C, *N, *M, *Hs;
    int64_t steps, heads, batch, dim, cn_step;
    bool input_exp, forget_exp;
};

template <typename T>
void run_rows(const Problem<T>& p, int64_t row_begin, int64_t row_end) {
    const int64_t D = p.dim, D4 = 4 * D, rows = p.heads * p.batch;
    std::vector<T> g(D4), h(D), c(D), n(D), m(D);
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
            const T* w = p.W + (t * rows + row) * D4;
            std::copy(w, w + D4, g.begin());
            for (int64_t k = 0; k < D; ++k) {  // g += h_prev R[head]: the inner loop vectorises
                const T hk = h[k];
                const T* r = R + k * D4;
                for (int64_t j = 0; j < D4; ++j) g[j] += hk * r[j];
            }
            std::copy(g.begin(), g.end(), p.G + (t * rows + row) * D4);
            for (int64_t j = 0; j < D; ++j) {
                const T gi = g[j], gf = g[D + j], gz = g[2 * D + j], go = g[3 * D + j];
                const T log_i = p.input_exp ? gi : log_sigmoid(gi);
                const T a = (p.forget_exp ? gf : log_sigmoid(gf)) + m[j];  // log f + m_prev
                const T m_new = nan_max(a, log_i);
                const T f_s = std::exp(a - m_new), i_s = std::exp(log_i - m_new);
                c[j] = f_s * c[j] + i_s * std::tanh(gz);
                n[j] = f_s * n[j] + i_s;
                m[j] = m_new;
            }
            for (int64_t j = 0; j < D; ++j) h[j] = c[j] / n[j] * sigmoid(g[3 * D + j]);
            const int64_t cn = (t + 1) * p.cn_step + row * D, s = ((t + 1) * rows + row) * D;
            std::copy(c.begin(), c.end(), p.C + cn);
            std::copy(n.begin(), n.end(), p.N + cn);
            std::copy(m.begin(), m.end(), p.M + s);
            std::copy(h.begin(), h.end(), p.Hs + s);
        }
    }
}

template <typename T>
void run(const Problem<T>& p, int64_t threads) {
    const int64_t rows = p.heads * p.batch;
    threads = std::max<int64_t>(1, std::min(threads, rows));
    if (threads == 1) {
        run_rows(p, 0, rows);
        return;
    }
    std::vector<std::thread> pool;
    const int64_t per = (rows + threads - 1) / threads;
    for (int64_t start = per; start < rows; start += per)
        pool.emplace_back(run_rows<T>, std::cref(p), start, std::min(rows, start + per));
    run_rows(p, 0, std::min(rows, per));  // this thread takes the first share
    for (auto& worker : pool) worker.join();
}

}  // namespace

#define XLSTM_ZOO_SLSTM_FORWARD(NAME, T)                                                                  \
    extern "C" void NAME(const T* W, const T* R, const T* c0, const T* n0, const T* m0, const T* h0, T* G, \
                         T* C, T* N, T* M, T* Hs, int64_t steps, int64_t heads, int64_t batch, int64_t dim,  \
                         int64_t cn_step, int input_exp, int forget_exp, int64_t threads) {               \
        run(Problem<T>{W, R, c0, n0, m0, h0, G, C, N, M, Hs, steps, heads, batch, dim, cn_step,             \
                       input_exp != 0, forget_exp != 0},                                                    \
            threads);                                                                                      \
    }

XLSTM_ZOO_SLSTM_FORWARD(xlstm_zoo_slstm_forward_f32, float)
XLSTM_ZOO_SLSTM_FORWARD(xlstm_zoo_slstm_forward_f64, double)
