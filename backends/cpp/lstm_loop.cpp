// Classic LSTM recurrence on the CPU, forward and backward, each whole time loop in C++. Same maths as
// backends/reference/lstm.py; the backward is the exact derivative that backends/fused/lstm.py writes in
// PyTorch.
//
// float32: one token for all batch rows at once, as a small matrix product (block_gemm.h) per head,
// with the threads splitting each head's units: a thread computes the four gate columns of its units
// for every row, then their cell update, then waits for the others (one barrier per token: the next
// token's product reads every unit of h). This is the schedule of a BLAS-backed LSTM without a library
// call per token, faster than the row loop below from a few rows of 128 units (docs/performance.md).
// float64 (gradcheck) and heads narrower than one vector keep one (head, batch) row per thread (see
// slstm_loop.cpp), a matrix-vector loop, faster than the batched product for narrow heads.
//
// Layout (row-major, time-major):
//   W, G   [T, H, B, 4D]   W x + b in, pre-activations out (G = W + h_prev R), gate order i, f, z, o
//   R      [H, D, 4D];  Rt [H, 4D, D] (R transposed, for the backward's axpys)
//   c0 h0  [H, B, D]
//   C, Hs  [T+1, H, B, D]   index 0 receives the initial state
//   starts [B, T] (bytes; null: none)  1 where a document starts: that token enters from the zero state
//                            (c = h = 0); the stored states stay those after each token
// Backward: dH [T, H, B, D] (null: zeros), dcT dhT [H, B, D] (null: zeros) in; dG [T, H, B, 4D] and
// dc0 dh0 [H, B, D] out (dR is one matmul in Python).

#include "loops.h"
#include "unit_team.h"

XLSTM_ZOO_WIDE_VECTORS

namespace {

using namespace xlstm_zoo;

template <typename T>
struct Problem {
    const T *W, *R, *c0, *h0;
    T *G, *C, *Hs;
    const uint8_t* starts;
    int64_t steps, heads, batch, dim;

    bool restarts(int64_t row, int64_t t) const { return starts && starts[(row % batch) * steps + t]; }
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
            if (p.restarts(row, t)) {
                std::fill(c, c + D, T(0));
                std::fill(h, h + D, T(0));
            }
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
    const uint8_t* starts;
    int64_t steps, heads, batch, dim;

    bool restarts(int64_t row, int64_t t) const { return starts && starts[(row % batch) * steps + t]; }
};

template <typename T>
void backward_rows(const Gradients<T>& p, int64_t row_begin, int64_t row_end) {
    const int64_t D = p.dim, D4 = 4 * D, rows = p.heads * p.batch;
    std::vector<T> dc_buf(D), dh_buf(D), dg_buf(D4);
    T *__restrict dc = dc_buf.data(), *__restrict dh_rec = dh_buf.data(), *__restrict dg = dg_buf.data();
    const std::vector<T> zeros(D, T(0));  // the cell state entering a token that starts a document
    for (int64_t row = row_begin; row < row_end; ++row) {
        const T* Rt = p.Rt + (row / p.batch) * D4 * D;
        load_row(dc, p.dcT, row, D);
        load_row(dh_rec, p.dhT, row, D);
        for (int64_t t = p.steps - 1; t >= 0; --t) {
            if (p.dH) {
                const T* dh_out = p.dH + (t * rows + row) * D;
                for (int64_t j = 0; j < D; ++j) dh_rec[j] += dh_out[j];
            }
            const bool restart = p.restarts(row, t);
            const T *__restrict g = p.G + (t * rows + row) * D4;
            const T *__restrict c = p.C + ((t + 1) * rows + row) * D;
            const T *__restrict c_prev = restart ? zeros.data() : c - rows * D;
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
            if (restart) {  // nothing reaches the state before a document start
                std::fill(dc, dc + D, T(0));
                std::fill(dh_rec, dh_rec + D, T(0));
            } else {
                recurrent_input_grad(dh_rec, dg, Rt, D);
            }
        }
        std::copy(dc, dc + D, p.dc0 + row * D);
        std::copy(dh_rec, dh_rec + D, p.dh0 + row * D);
    }
}

// ---- float32: all batch rows per token, units split over threads (unit_team.h) ---------------------------

void forward_batched(const Problem<float>& p, int64_t threads) {
    const int64_t D = p.dim, D4 = 4 * D, H = p.heads, B = p.batch, rows = H * B;
    std::copy(p.c0, p.c0 + rows * D, p.C);
    std::copy(p.h0, p.h0 + rows * D, p.Hs);
    const std::vector<float> zeros(D, 0.0f);  // the cell state entering a token that starts a document
    team(batched_threads(H, B, D, threads), [&](int index, int count, const TeamBarrier& barrier) {
        int64_t j0, j1;
        owned_units(D, index, count, j0, j1);
        for (int64_t t = 0; t < p.steps; ++t) {
            for (int64_t h = 0; h < H; ++h) {
                const int64_t at = (t * H + h) * B;  // row (t, h, b = 0)
                float *G = p.G + at * D4;
                const float *W = p.W + at * D4, *R = p.R + h * D * D4, *h_prev = p.Hs + at * D;
                const float *c_prev = p.C + at * D;
                float *c_next = p.C + (at + rows) * D, *h_next = p.Hs + (at + rows) * D;
                unit_preactivations(B, D, j0, j1, h_prev, R, W, G, [&](int64_t b) { return p.restarts(b, t); });
                for (int64_t b = 0; b < B; ++b) {
                    const bool restart = p.restarts(b, t);
                    const float* g = G + b * D4;
                    const float* cp = restart ? zeros.data() : c_prev + b * D;
                    XLSTM_ZOO_SIMD
                    for (int64_t j = j0; j < j1; ++j) {
                        const float c = sigmoid(g[D + j]) * cp[j] + sigmoid(g[j]) * vtanh(g[2 * D + j]);
                        c_next[b * D + j] = c;
                        h_next[b * D + j] = vtanh(c) * sigmoid(g[3 * D + j]);
                    }
                }
            }
            barrier.wait();  // h_{t+1} complete before any thread's next product reads it
        }
    });
}

void backward_batched(const Gradients<float>& p, int64_t threads) {
    const int64_t D = p.dim, D4 = 4 * D, H = p.heads, B = p.batch, rows = H * B;
    std::vector<float> dc_buf(rows * D), dh_buf(rows * D);  // per (head, row): the carried dc and dh
    float *dc = dc_buf.data(), *dh_rec = dh_buf.data();
    for (int64_t r = 0; r < rows; ++r) {
        load_row(dc + r * D, p.dcT, r, D);
        load_row(dh_rec + r * D, p.dhT, r, D);
    }
    const std::vector<float> zeros(D, 0.0f);  // the cell state entering a token that starts a document
    team(batched_threads(H, B, D, threads), [&](int index, int count, const TeamBarrier& barrier) {
        int64_t j0, j1;
        owned_units(D, index, count, j0, j1);
        for (int64_t t = p.steps - 1; t >= 0; --t) {
            for (int64_t h = 0; h < H; ++h) {
                const int64_t at = (t * H + h) * B;
                const float *G = p.G + at * D4, *c_all = p.C + (at + rows) * D, *c_prev_all = p.C + at * D;
                float* dG = p.dG + at * D4;
                for (int64_t b = 0; b < B; ++b) {
                    const int64_t r = h * B + b;
                    const bool restart = p.restarts(b, t);
                    const float *__restrict g = G + b * D4, *__restrict c = c_all + b * D;
                    const float *__restrict c_prev = restart ? zeros.data() : c_prev_all + b * D;
                    const float* dh_out = p.dH ? p.dH + (at + b) * D : nullptr;
                    float *__restrict dg = dG + b * D4, *__restrict dcr = dc + r * D, *__restrict dhr = dh_rec + r * D;
                    XLSTM_ZOO_SIMD
                    for (int64_t j = j0; j < j1; ++j) {
                        const float i = sigmoid(g[j]), f = sigmoid(g[D + j]), z = vtanh(g[2 * D + j]);
                        const float o = sigmoid(g[3 * D + j]), tc = vtanh(c[j]);
                        const float dh = dhr[j] + (dh_out ? dh_out[j] : 0.0f);
                        const float dct = dcr[j] + dh * (o * (1.0f - tc * tc));
                        dg[j] = dct * (z * (i * (1.0f - i)));
                        dg[D + j] = dct * (c_prev[j] * (f * (1.0f - f)));
                        dg[2 * D + j] = dct * (i * (1.0f - z * z));
                        dg[3 * D + j] = dh * (tc * (o * (1.0f - o)));
                        dcr[j] = dct * f;
                    }
                    // Nothing reaches the state before a document start. Not a select in the loop above: that
                    // stops gcc vectorising it (fwd+bwd 1.4x slower at B=4 T=1024 D=128).
                    if (restart) std::fill(dcr + j0, dcr + j1, 0.0f);
                }
            }
            barrier.wait();  // every unit's dG_t complete before the products below read all of it
            for (int64_t h = 0; h < H; ++h) {
                const int64_t at = (t * H + h) * B;
                unit_recurrent_grad(B, D, j0, j1, p.dG + at * D4, p.Rt + h * D4 * D, dh_rec + h * B * D,
                                    [&](int64_t b) { return p.restarts(b, t); });
            }
            // No barrier here: the next token writes dG_{t-1}, and each thread reads only its own dh_rec units.
        }
    });
    std::copy(dc, dc + rows * D, p.dc0);
    std::copy(dh_rec, dh_rec + rows * D, p.dh0);
}

}  // namespace

extern "C" void xlstm_zoo_lstm_forward_f32(const float* W, const float* R, const float* c0, const float* h0, float* G,
                                          float* C, float* Hs, const uint8_t* starts, int64_t steps, int64_t heads,
                                          int64_t batch, int64_t dim, int64_t threads) {
    const Problem<float> p{W, R, c0, h0, G, C, Hs, starts, steps, heads, batch, dim};
    if (dim >= kUnitBlock) forward_batched(p, threads);
    else run(p, forward_rows<float>, threads);  // heads narrower than a vector: the row loop is faster
}

extern "C" void xlstm_zoo_lstm_backward_f32(const float* G, const float* Rt, const float* C, const float* dH,
                                           const float* dcT, const float* dhT, float* dG, float* dc0, float* dh0,
                                           const uint8_t* starts, int64_t steps, int64_t heads, int64_t batch,
                                           int64_t dim, int64_t threads) {
    const Gradients<float> p{G, Rt, C, dH, dcT, dhT, dG, dc0, dh0, starts, steps, heads, batch, dim};
    if (dim >= kUnitBlock) backward_batched(p, threads);
    else run(p, backward_rows<float>, threads);
}

extern "C" void xlstm_zoo_lstm_forward_f64(const double* W, const double* R, const double* c0, const double* h0,
                                          double* G, double* C, double* Hs, const uint8_t* starts, int64_t steps,
                                          int64_t heads, int64_t batch, int64_t dim, int64_t threads) {
    run(Problem<double>{W, R, c0, h0, G, C, Hs, starts, steps, heads, batch, dim}, forward_rows<double>, threads);
}

extern "C" void xlstm_zoo_lstm_backward_f64(const double* G, const double* Rt, const double* C, const double* dH,
                                           const double* dcT, const double* dhT, double* dG, double* dc0,
                                           double* dh0, const uint8_t* starts, int64_t steps, int64_t heads,
                                           int64_t batch, int64_t dim, int64_t threads) {
    run(Gradients<double>{G, Rt, C, dH, dcT, dhT, dG, dc0, dh0, starts, steps, heads, batch, dim},
        backward_rows<double>, threads);
}
