// One mLSTM token for one (batch, head) row: the gates' log activations, the stabiliser, the memory and
// normaliser updates and the readout of backends/reference/mlstm/step.py (prepare + step_core) in one
// pass over the row's memory. Used by mlstm_step.cpp (the op) and block_step.cpp (the 7B block's step).
//
// Layout (row-major; rows = batch * heads): q, k [rows, Dk]; v [rows, Dv]; i_pre, f_pre [rows];
// C [rows, Dk, Dv], n [rows, Dk], m [rows] in; h [rows, Dv] and the new C, n, m out (new buffers: the
// state passed in stays valid, as the reference's does).
#pragma once

#include "loops.h"

namespace xlstm_zoo {

constexpr float kFloorLogMax = 80.0f;  // reference FLOOR_LOG_MAX: exp(-m) clamped at exp(80)

struct Step {
    const float *q, *k, *v, *i_pre, *f_pre, *C, *n, *m;
    float *h, *C_out, *n_out, *m_out;
    int64_t Dk, Dv;
    float scale, eps;
    bool exp_input, exp_forget;
};

inline void step_row(const Step& p, int64_t row, float* __restrict num) {
    const int64_t Dk = p.Dk, Dv = p.Dv;
    const float log_i = p.exp_input ? p.i_pre[row] : log_sigmoid(p.i_pre[row]);
    const float log_f = p.exp_forget ? p.f_pre[row] : log_sigmoid(p.f_pre[row]);
    // One sum serves both the maximum and f', so f' is exactly 1 when the forget branch wins.
    const float logfm = log_f + p.m[row];
    const float m_new = nan_max(logfm, log_i);
    const float f_act = std::exp(logfm - m_new), i_act = std::exp(log_i - m_new);
    const float *__restrict q = p.q + row * Dk, *__restrict k = p.k + row * Dk, *__restrict v = p.v + row * Dv;
    const float *__restrict n = p.n + row * Dk;
    float *__restrict n_out = p.n_out + row * Dk;
    std::fill(num, num + Dv, 0.0f);
    float qn = 0.0f;
    for (int64_t a = 0; a < Dk; ++a) {
        const float ka = k[a], qa = q[a] * p.scale;
        n_out[a] = f_act * n[a] + i_act * ka;
        qn += qa * n_out[a];
        const float* __restrict C = p.C + (row * Dk + a) * Dv;
        float* __restrict C_out = p.C_out + (row * Dk + a) * Dv;
        XLSTM_ZOO_SIMD
        for (int64_t b = 0; b < Dv; ++b) {
            C_out[b] = f_act * C[b] + i_act * (ka * v[b]);
            num[b] += qa * C_out[b];
        }
    }
    const float den = std::max(std::fabs(qn), std::exp(std::min(-m_new, kFloorLogMax))) + p.eps;
    float* __restrict h = p.h + row * Dv;
    for (int64_t b = 0; b < Dv; ++b) h[b] = num[b] / den;
    p.m_out[row] = m_new;
}

}  // namespace xlstm_zoo
