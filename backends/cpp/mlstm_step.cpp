// The mLSTM step op: every (batch, head) row of one token (mlstm_step.h), rows split over threads. The
// PyTorch step runs ~25 small ops per token and layer, each costing more to dispatch than its arithmetic
// at generation sizes.

#include "mlstm_step.h"

using namespace xlstm_zoo;

extern "C" void xlstm_zoo_mlstm_step_f32(const float* q, const float* k, const float* v, const float* i_pre,
                                         const float* f_pre, const float* C, const float* n, const float* m,
                                         float* h, float* C_out, float* n_out, float* m_out, int64_t rows,
                                         int64_t Dk, int64_t Dv, float scale, float eps, int exp_input,
                                         int exp_forget, int64_t threads) {
    const Step p{q, k, v, i_pre, f_pre, C, n, m, h, C_out, n_out, m_out, Dk, Dv, scale, eps,
                 exp_input != 0, exp_forget != 0};
    // A row is Dk * Dv multiply-adds twice; small steps stay on the calling thread.
    if (rows * Dk * Dv * 2 < (int64_t(1) << 16)) threads = 1;
    parallel_rows(rows, threads, [&]() {
        return [&p, num = std::vector<float>(p.Dv)](int64_t row) mutable { step_row(p, row, num.data()); };
    });
}
