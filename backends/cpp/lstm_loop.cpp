// Classic LSTM recurrence on the CPU, forward and backward, each whole time loop in C++ (see slstm_loop.cpp
// for the build and the row-per-thread scheme). Same maths as backends/reference/lstm.py; the backward is
// the exact derivative that backends/fused/lstm.py writes in PyTorch.
//
// Layout (row-major, time-major):
//   W, G   [T, H, B, 4D]   W x + b in, pre-activations out (G = W + h_prev R), gate order i, f, z, o
//   R      [H, D, 4D];  Rt [H, 4D, D] (R transposed, for the backward's axpys)
//   c0 h0  [H, B, D]
//   C, Hs  [T+1, H, B, D]   index 0 receives the initial state
// Backward: dH [T, H, B, D] (null: zeros), dcT dhT [H, B, D] (null: zeros) in; dG [T, H, B, 4D] and
// dc0 dh0 [H, B, D] out (dR is one matmul in Python).

#include "loops.h"

namespace {

using namespace xlstm_zoo;

template <typename T>
struct Problem {
    const T *W, *R, *c0, *h0;
    T *G, *C, *Hs;
    int64_t steps, heads, batch, dim;
};

template <typename T>
void forward_rows(const Problem<T>& p, int64_t row_begin, int64_t row_end) {
    const int64_t D = p.dim, D4 = 4 * D, rows = p.heads * p.batch;
    std::vector<T> g_buf(D4), h_buf(D), c_buf(D);
    T *__restrict g = g_buf.data(), *__restrict h = h_buf.data(), *__restrict c = c_buf.data();
    for (int64_t row = row_begin; row < row_end; ++row) {
        const T* R = p.R + (row / p.batch) * D * D4;
        std::copy(p.c0 + row * D, p.c0 + (row + 1) * D, c);
        std::copy(p.h0 + row * D, p.h0 + (row + 1) * D, h);
        std::copy(c, c + D, p.C + row * D);
        std::copy(h, h + D, p.Hs + row * D);
        for (int64_t t = 0; t < p.steps; ++t) {
            preactivations(g, p.W + (t * rows + row) * D4, h, R, D);
            std::copy(g, g + D4, p.G + (t * rows + row) * D4);
            XLSTM_ZOO_SIMD
            for (int64_t j = 0; j < D; ++j) {
                c[j] = sigmoid(g[D + j]) * c[j] + sigmoid(g[j]) * vtanh(g[2 * D + j]);
                h[j] = vtanh(c[j]) * sigmoid(g[3 * D + j]);
            }
            std::copy(c, c + D, p.C + ((t + 1) * rows + row) * D);
            std::copy(h, h + D, p.Hs + ((t + 1) * rows + row) * D);
        }
    }
}

template <typename T>
struct Gradients {
    const T *G, *Rt, *C, *dH, *dcT, *dhT;
    T *dG, *dc0, *dh0;
    int64_t steps, heads, batch, dim;
};

template <typename T>
void backward_rows(const Gradients<T>& p, int64_t row_begin, int64_t row_end) {
    const int64_t D = p.dim, D4 = 4 * D, rows = p.heads * p.batch;
    std::vector<T> dc_buf(D), dh_buf(D), dg_buf(D4);
    T *__restrict dc = dc_buf.data(), *__restrict dh_rec = dh_buf.data(), *__restrict dg = dg_buf.data();
    for (int64_t row = row_begin; row < row_end; ++row) {
        const T* Rt = p.Rt + (row / p.batch) * D4 * D;
        load_row(dc, p.dcT, row, D);
        load_row(dh_rec, p.dhT, row, D);
        for (int64_t t = p.steps - 1; t >= 0; --t) {
            if (p.dH) {
                const T* dh_out = p.dH + (t * rows + row) * D;
                for (int64_t j = 0; j < D; ++j) dh_rec[j] += dh_out[j];
            }
            const T *__restrict g = p.G + (t * rows + row) * D4;
            const T *__restrict c = p.C + ((t + 1) * rows + row) * D, *__restrict c_prev = c - rows * D;
            XLSTM_ZOO_SIMD
            for (int64_t j = 0; j < D; ++j) {
                const T i = sigmoid(g[j]), f = sigmoid(g[D + j]), z = vtanh(g[2 * D + j]), o = sigmoid(g[3 * D + j]);
                const T tc = vtanh(c[j]), dh = dh_rec[j];
                const T dct = dc[j] + dh * (o * (T(1) - tc * tc));
                dg[j] = dct * (z * (i * (T(1) - i)));
                dg[D + j] = dct * (c_prev[j] * (f * (T(1) - f)));
                dg[2 * D + j] = dct * (i * (T(1) - z * z));
                dg[3 * D + j] = dh * (tc * (o * (T(1) - o)));
                dc[j] = dct * f;
            }
            std::copy(dg, dg + D4, p.dG + (t * rows + row) * D4);
            recurrent_input_grad(dh_rec, dg, Rt, D);
        }
        std::copy(dc, dc + D, p.dc0 + row * D);
        std::copy(dh_rec, dh_rec + D, p.dh0 + row * D);
    }
}

}  // namespace

#define XLSTM_ZOO_LSTM_ENTRIES(SUFFIX, T)                                                                    \
    extern "C" void xlstm_zoo_lstm_forward_##SUFFIX(const T* W, const T* R, const T* c0, const T* h0, T* G,  \
                                                    T* C, T* Hs, int64_t steps, int64_t heads,              \
                                                    int64_t batch, int64_t dim, int64_t threads) {          \
        run(Problem<T>{W, R, c0, h0, G, C, Hs, steps, heads, batch, dim}, forward_rows<T>, threads);         \
    }                                                                                                        \
    extern "C" void xlstm_zoo_lstm_backward_##SUFFIX(const T* G, const T* Rt, const T* C, const T* dH,       \
                                                     const T* dcT, const T* dhT, T* dG, T* dc0, T* dh0,     \
                                                     int64_t steps, int64_t heads, int64_t batch,           \
                                                     int64_t dim, int64_t threads) {                        \
        run(Gradients<T>{G, Rt, C, dH, dcT, dhT, dG, dc0, dh0, steps, heads, batch, dim}, backward_rows<T>,  \
            threads);                                                                                        \
    }

XLSTM_ZOO_LSTM_ENTRIES(f32, float)
XLSTM_ZOO_LSTM_ENTRIES(f64, double)
