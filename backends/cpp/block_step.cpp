// The xLSTM-7B block's generation step (zoo/blocks/mlstm_7b.py) in one call, no autograd:
//   pre-norm (RMS) -> q, k, v, output-gate and gate projections -> soft-capped gates -> mLSTM step ->
//   per-head LayerNorm -> * sigmoid(o) -> out projection -> residual -> pre-norm (RMS) -> gated MLP -> residual.
// Eagerly that is ~100 small PyTorch ops per block and token, whose dispatch costs more than their
// arithmetic at generation sizes; here it is five parallel regions (the six projections of the normed
// input share one) and a few loops over a row.
//
// Layout (row-major, B = batch rows): x, y [B, dim]; C [B, H, Dk, Dv], n [B, H, Dk], m [B, H] in,
// C_out, n_out, m_out out (new buffers: the state passed in stays valid). Weights in nn.Linear's layout
// [out, in]; every bias and the gates' projections may be null (zeros / no projection). The gates' soft
// cap is cap * tanh(pre / cap), none when cap is 0.

#include <cmath>
#include <vector>

#include "linear_rows.h"
#include "mlstm_step.h"

namespace {

using namespace xlstm_zoo;

struct BlockStep {
    const float *x, *C, *n, *m;
    float *y, *C_out, *n_out, *m_out;
    const float *norm_w, *norm_b;
    const float *Wq, *bq, *Wk, *bk, *Wv, *bv, *Wo, *bo, *Wi, *bi, *Wf, *bf;
    const float *head_norm_w, *head_norm_b;
    const float *Wout, *bout;
    const float *mlp_norm_w, *mlp_norm_b;
    const float *Wup, *bup, *Wdown, *bdown;
    int64_t batch, dim, heads, qk_dim, hidden, exp_input, exp_forget, gelu, threads;
    float norm_eps, mlp_norm_eps, head_norm_eps, i_cap, f_cap, qk_scale, cell_eps;
};

// out = x * rsqrt(mean(x^2) + eps) * w (+ b), per row of D features.
void rms_norm(const float* x, float* out, int64_t rows, int64_t D, const float* w, const float* b, float eps) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * D;
        float* o = out + r * D;
        float ss = 0.0f;
        XLSTM_ZOO_SIMD_REDUCE(+ : ss)
        for (int64_t j = 0; j < D; ++j) ss += xr[j] * xr[j];
        const float scale = 1.0f / std::sqrt(ss / float(D) + eps);
        for (int64_t j = 0; j < D; ++j) o[j] = xr[j] * scale * w[j] + (b ? b[j] : 0.0f);
    }
}

// Each of `groups` slices of D features per row: LayerNorm (biased variance, no affine map of its own),
// then the affine map over all features, then times sigmoid(gate).
void head_norm_gate(float* h, const float* gate, int64_t rows, int64_t groups, int64_t D, const float* w,
                    const float* b, float eps) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < groups; ++g) {
            float* x = h + (r * groups + g) * D;
            const float* o = gate + (r * groups + g) * D;
            const float* wg = w + g * D;
            const float* bg = b ? b + g * D : nullptr;
            float mean = 0.0f, var = 0.0f;
            for (int64_t j = 0; j < D; ++j) mean += x[j];
            mean /= float(D);
            for (int64_t j = 0; j < D; ++j) var += (x[j] - mean) * (x[j] - mean);
            const float rstd = 1.0f / std::sqrt(var / float(D) + eps);
            XLSTM_ZOO_SIMD
            for (int64_t j = 0; j < D; ++j) x[j] = ((x[j] - mean) * rstd * wg[j] + (bg ? bg[j] : 0.0f)) * sigmoid(o[j]);
        }
}

// Gate pre-activations [rows, units] in place: bias added where there was no projection's, then soft-capped.
void gate_preactivations(float* pre, int64_t rows, int64_t units, bool projected, const float* bias, float cap) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t u = 0; u < units; ++u) {
            float& p = pre[r * units + u];
            if (!projected) p = bias[u];
            if (cap > 0.0f) p = cap * std::tanh(p / cap);
        }
}

// a [rows, hidden] = act(u[:, :hidden]) * u[:, hidden:] for u [rows, 2 hidden].
void gated_activation(const float* u, float* a, int64_t rows, int64_t hidden, bool gelu) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *g = u + r * 2 * hidden, *up = g + hidden;
        float* out = a + r * hidden;
        if (gelu)
            for (int64_t j = 0; j < hidden; ++j) out[j] = 0.5f * g[j] * (1.0f + std::erf(g[j] * float(M_SQRT1_2))) * up[j];
        else
            silu_gate_row(g, up, out, hidden);
    }
}

void block_step(const BlockStep& p) {
    const int64_t B = p.batch, D = p.dim, H = p.heads, Dqk = p.qk_dim, F = p.hidden;
    const int64_t Dk = Dqk / H, Dv = D / H, rows = B * H;
    std::vector<float> scratch(B * (6 * D + 2 * Dqk + 2 * H + 3 * F));
    float* xn = scratch.data();  // the normed input, then (after the cell) the residual stream
    float *q = xn + B * D, *k = q + B * Dqk, *v = k + B * Dqk, *o = v + B * D, *i_pre = o + B * D;
    float *f_pre = i_pre + B * H, *h = f_pre + B * H, *proj = h + B * D, *u = proj + B * D, *a = u + 2 * B * F;

    rms_norm(p.x, xn, B, D, p.norm_w, p.norm_b, p.norm_eps);
    Linear inputs[6] = {{xn, p.Wq, p.bq, q, B, Dqk, D}, {xn, p.Wk, p.bk, k, B, Dqk, D},
                        {xn, p.Wv, p.bv, v, B, D, D},     {xn, p.Wo, p.bo, o, B, D, D},
                        {xn, p.Wi, p.bi, i_pre, B, H, D}, {xn, p.Wf, p.bf, f_pre, B, H, D}};
    int count = 4;  // a gate without a projection is its bias alone
    if (p.Wi) inputs[count++] = inputs[4];
    if (p.Wf) inputs[count++] = inputs[5];
    linear_parts(inputs, count, p.threads);
    gate_preactivations(i_pre, B, H, p.Wi != nullptr, p.bi, p.i_cap);
    gate_preactivations(f_pre, B, H, p.Wf != nullptr, p.bf, p.f_cap);

    const Step cell{q, k, v, i_pre, f_pre, p.C, p.n, p.m, h, p.C_out, p.n_out, p.m_out, Dk, Dv, p.qk_scale,
                    p.cell_eps, p.exp_input != 0, p.exp_forget != 0};
    const int64_t cell_threads = rows * Dk * Dv * 2 < (int64_t(1) << 16) ? 1 : p.threads;
    parallel_rows(rows, cell_threads, [&]() {
        return [&cell, num = std::vector<float>(Dv)](int64_t row) mutable { step_row(cell, row, num.data()); };
    });
    head_norm_gate(h, o, B, H, Dv, p.head_norm_w, p.head_norm_b, p.head_norm_eps);

    const Linear out[1] = {{h, p.Wout, p.bout, proj, B, D, D}};
    linear_parts(out, 1, p.threads);
    float* x1 = xn;  // the normed input is spent: it now holds x + out_proj(h)
    for (int64_t j = 0; j < B * D; ++j) x1[j] = p.x[j] + proj[j];

    rms_norm(x1, h, B, D, p.mlp_norm_w, p.mlp_norm_b, p.mlp_norm_eps);  // h is spent too
    const Linear up[1] = {{h, p.Wup, p.bup, u, B, 2 * F, D}};
    linear_parts(up, 1, p.threads);
    gated_activation(u, a, B, F, p.gelu != 0);
    const Linear down[1] = {{a, p.Wdown, p.bdown, proj, B, D, F}};
    linear_parts(down, 1, p.threads);
    for (int64_t j = 0; j < B * D; ++j) p.y[j] = x1[j] + proj[j];
}

}  // namespace

// One block, or a stack's blocks in order, in one call: block j's x is block j - 1's y. No return to Python
// between blocks, whose weights push the interpreter out of cache.
extern "C" void xlstm_zoo_mlstm7b_blocks_step_f32(const BlockStep* blocks, int64_t count) {
    for (int64_t j = 0; j < count; ++j) block_step(blocks[j]);
}
