// The mLSTM chunkwise form's intra-chunk core, forward and backward, one (batch-head, chunk) block at a time.
//
// The PyTorch core (backends/reference/mlstm/chunkwise_backward.py) runs each step over all blocks at
// once: every [L, L] intermediate is a 4 MiB tensor at B=4 H=4 T=1024 L=64, so each of its ~35 passes
// and 13 batched matmuls streams through memory. Here a thread takes one block, keeps its [L, L]
// matrices (16 KiB each at L=64) in its own cache for the whole chain and calls the BLAS for the
// block's small matmuls. The backward recomputes the decay matrix and the scores from q, k and the
// gates instead of keeping three [L, L] tensors per block from the forward.
//
// The maths, including where the function is not smooth (ties of the stabiliser's maxima, the readout
// floor), is that of chunkwise_backward.py and parallel.py; the Python side's docstrings say why.
// Layout per block: q, k [L, Dk], v [L, Dv], log_i, log_f [L], C0 [Dk, Dv], n0 [Dk], m0 [1]; row-major.
#include "block_gemm.h"
#include "loops.h"

namespace {

// Row-major C [M, N] = op(A) op(B) (+ C if accumulate), op(A) [M, K] and op(B) [K, N]; ld* are row
// strides; scratch holds K * N floats (a transposed B is copied there first).
using xlstm_zoo::block_gemm;

constexpr float kFloorLogMax = 80.0f;  // readout floor exp(-m), -m clamped here (step.py: FLOOR_LOG_MAX)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Sizes {
    int64_t blocks, L, Dk, Dv;
    float eps;
};

// The block's decay matrix: x = log D - m (row stabiliser m), d = exp(x) (0 above the diagonal), and
// the initial state's log weight minus m (lw0x) and weight (w0). Returns nothing; fills the buffers.
void decay(const Sizes& s, const float* log_i, const float* log_f, float m0, float* x, float* d, float* m,
           float* lw0x, float* w0, double* seg) {
    const int64_t L = s.L;
    // Segment sums sum_{r=s+1..t} log f_r (column s, row t) as running sums down each column, no
    // differences of prefix sums; accumulated in double as torch's CPU cumsum does. Row t is row t-1 plus
    // log f_t, so the loop runs along rows (contiguous, vectorised).
    for (int64_t c = 0; c < L; ++c) seg[c] = 0.0;
    for (int64_t t = 0; t < L; ++t) {
        float* xr = x + t * L;
        const double f = log_f[t];
        XLSTM_ZOO_SIMD
        for (int64_t c = 0; c < t; ++c) {
            seg[c] += f;
            xr[c] = static_cast<float>(seg[c]) + log_i[c];
        }
        xr[t] = log_i[t];
    }
    double acc = 0.0;
    for (int64_t t = 0; t < L; ++t) {
        acc += log_f[t];
        const float log_w0 = static_cast<float>(acc) + m0;
        float row_max = kNegInf;
        float* xr = x + t * L;
        for (int64_t c = 0; c <= t; ++c) row_max = xlstm_zoo::nan_max(row_max, xr[c]);
        const float mt = xlstm_zoo::nan_max(row_max, log_w0);
        m[t] = mt;
        float* dr = d + t * L;
        XLSTM_ZOO_SIMD
        for (int64_t c = 0; c <= t; ++c) {
            xr[c] -= mt;
            dr[c] = xlstm_zoo::vexp(xr[c]);
        }
        for (int64_t c = t + 1; c < L; ++c) {
            xr[c] = kNegInf;
            dr[c] = 0.0f;
        }
        lw0x[t] = log_w0 - mt;
        w0[t] = std::exp(lw0x[t]);
    }
}

inline float readout_floor(float m) { return std::exp(std::min(-m, kFloorLogMax)); }

inline float dot(const float* a, const float* b, int64_t n) {
    float acc = 0.0f;
    XLSTM_ZOO_SIMD
    for (int64_t j = 0; j < n; ++j) acc += a[j] * b[j];
    return acc;
}

struct Forward {
    Sizes s;
    const float *q, *k, *v, *log_i, *log_f, *C0, *n0, *m0;
    float *h, *m, *qn, *den;  // outputs: h [L, Dv]; the row stabiliser, q.n and the denominator [L]
};

// One thread's buffers, reused for each of its blocks (the backward's on top of the forward's).
struct Workspace {
    std::vector<float> x, d, scores, lw0x, w0, q_n0, m, bt;
    std::vector<float> dnum, dqn, dm, dw0, d_lw0, d_scores, d_qk, G, buf_lv;
    std::vector<double> seg, below;
    Workspace(const Sizes& s, bool backward)
        : x(s.L * s.L), d(s.L * s.L), scores(s.L * s.L), lw0x(s.L), w0(s.L), q_n0(s.L), m(s.L),
          bt(std::max({s.L, s.Dk, s.Dv}) * std::max({s.L, s.Dk, s.Dv})), seg(s.L) {
        if (!backward) return;
        const int64_t L = s.L;
        dnum.resize(L * s.Dv), dqn.resize(L), dm.resize(L), dw0.resize(L), d_lw0.resize(L);
        d_scores.resize(L * L), d_qk.resize(L * L), G.resize(L * s.Dk), buf_lv.resize(L * s.Dv), below.resize(L);
    }
};

// Scores (q k^T) * d and the initial state's terms, shared by the forward and the backward's recompute.
void scores_and_state_terms(const Sizes& s, const float* q, const float* k, const float* n0, Workspace& w) {
    const int L = s.L, Dk = s.Dk;
    block_gemm(false, true, L, L, Dk, q, Dk, k, Dk, false, w.scores.data(), L, w.bt.data());
    for (int64_t i = 0; i < s.L * s.L; ++i) w.scores[i] *= w.d[i];
    for (int t = 0; t < L; ++t) w.q_n0[t] = dot(n0, q + int64_t(t) * Dk, Dk);
}

void forward_block(const Forward& p, int64_t b, Workspace& w) {
    const Sizes& s = p.s;
    const int L = s.L, Dk = s.Dk, Dv = s.Dv;
    const float *q = p.q + b * L * Dk, *k = p.k + b * L * Dk, *v = p.v + b * L * Dv;
    const float *C0 = p.C0 + b * Dk * Dv, *n0 = p.n0 + b * Dk;
    float *h = p.h + b * L * Dv, *m = p.m + b * L, *qn = p.qn + b * L, *den = p.den + b * L;
    decay(s, p.log_i + b * L, p.log_f + b * L, p.m0[b], w.x.data(), w.d.data(), m, w.lw0x.data(), w.w0.data(), w.seg.data());
    scores_and_state_terms(s, q, k, n0, w);
    // num = w0 * (q C0) + scores v, accumulated in h
    block_gemm(false, false, L, Dv, Dk, q, Dk, C0, Dv, false, h, Dv, w.bt.data());
    for (int t = 0; t < L; ++t) {
        float* hr = h + int64_t(t) * Dv;
        for (int j = 0; j < Dv; ++j) hr[j] *= w.w0[t];
    }
    block_gemm(false, false, L, Dv, L, w.scores.data(), L, v, Dv, true, h, Dv, w.bt.data());
    for (int t = 0; t < L; ++t) {
        const float* sr = w.scores.data() + int64_t(t) * L;
        float row = 0.0f;
        for (int c = 0; c < L; ++c) row += sr[c];
        qn[t] = row + w.w0[t] * w.q_n0[t];
        den[t] = xlstm_zoo::nan_max(std::abs(qn[t]), readout_floor(m[t])) + s.eps;
        float* hr = h + int64_t(t) * Dv;
        for (int j = 0; j < Dv; ++j) hr[j] /= den[t];
    }
}

struct Backward {
    Sizes s;
    const float *q, *k, *v, *log_i, *log_f, *C0, *n0, *m0, *h, *qn, *den, *dh;
    float *dq, *dk, *dv, *dlog_i, *dlog_f, *dC0, *dn0, *dm0;
};

void backward_block(const Backward& p, int64_t b, Workspace& w) {
    const Sizes& s = p.s;
    const int L = s.L, Dk = s.Dk, Dv = s.Dv;
    const float *q = p.q + b * L * Dk, *k = p.k + b * L * Dk, *v = p.v + b * L * Dv;
    const float *C0 = p.C0 + b * Dk * Dv, *n0 = p.n0 + b * Dk;
    const float *h = p.h + b * L * Dv, *qn = p.qn + b * L, *den = p.den + b * L, *dh = p.dh + b * L * Dv;
    float *dq = p.dq + b * L * Dk, *dk = p.dk + b * L * Dk, *dv = p.dv + b * L * Dv;
    float *dlog_i = p.dlog_i + b * L, *dlog_f = p.dlog_f + b * L, *dC0 = p.dC0 + b * Dk * Dv, *dn0 = p.dn0 + b * Dk;
    float* m = w.m.data();  // recomputed: the same operations as the forward's
    decay(s, p.log_i + b * L, p.log_f + b * L, p.m0[b], w.x.data(), w.d.data(), m, w.lw0x.data(), w.w0.data(), w.seg.data());
    scores_and_state_terms(s, q, k, n0, w);
    const float *x = w.x.data(), *d = w.d.data(), *scores = w.scores.data(), *w0 = w.w0.data();

    // Readout h = num / den, den = max(|qn|, floor(m)) + eps.
    float *dnum = w.dnum.data(), *dqn = w.dqn.data(), *dm = w.dm.data(), *dw0 = w.dw0.data(), *d_lw0 = w.d_lw0.data();
    float *d_scores = w.d_scores.data(), *d_qk = w.d_qk.data();
    for (int t = 0; t < L; ++t) {
        const float* dhr = dh + int64_t(t) * Dv;
        float* dnr = dnum + int64_t(t) * Dv;
        for (int j = 0; j < Dv; ++j) dnr[j] = dhr[j] / den[t];
        const float d_den = -dot(dhr, h + int64_t(t) * Dv, Dv) / den[t];
        const float abs_qn = std::abs(qn[t]), floor = readout_floor(m[t]);
        const float split = abs_qn == floor ? d_den / 2 : d_den;
        const float sgn = qn[t] > 0 ? 1.0f : (qn[t] < 0 ? -1.0f : 0.0f);
        dqn[t] = (abs_qn < floor ? 0.0f : split) * sgn;
        const float d_floor = abs_qn > floor ? 0.0f : split;
        dm[t] = -m[t] > kFloorLogMax ? 0.0f : -(d_floor * floor);
    }

    // Initial-state terms: num += w0 (q C0), qn += w0 (q . n0). With G = dnum C0^T:
    // d w0 = q . G + dqn (q . n0), dq = w0 G + dqn w0 n0, dC0 = q^T (w0 dnum), dn0 = q^T (dqn w0).
    float* G = w.G.data();
    block_gemm(false, true, L, Dk, Dv, dnum, Dv, C0, Dv, false, G, Dk, w.bt.data());
    std::fill(dn0, dn0 + Dk, 0.0f);
    for (int t = 0; t < L; ++t) {
        const float* qr = q + int64_t(t) * Dk;
        const float* gr = G + int64_t(t) * Dk;
        dw0[t] = dot(qr, gr, Dk) + dqn[t] * w.q_n0[t];
        const float dq_n0 = dqn[t] * w0[t];
        float* dqr = dq + int64_t(t) * Dk;
        for (int i = 0; i < Dk; ++i) {
            dqr[i] = w0[t] * gr[i] + dq_n0 * n0[i];
            dn0[i] += dq_n0 * qr[i];
        }
    }
    float* dq_c0 = w.buf_lv.data();
    for (int t = 0; t < L; ++t)
        for (int j = 0; j < Dv; ++j) dq_c0[int64_t(t) * Dv + j] = w0[t] * dnum[int64_t(t) * Dv + j];
    block_gemm(true, false, Dk, Dv, L, q, Dk, dq_c0, Dv, false, dC0, Dv, w.bt.data());

    // Intra-chunk terms: num += scores v, qn += rowsum(scores), scores = (q k^T) * d.
    block_gemm(false, true, L, L, Dv, dnum, Dv, v, Dv, false, d_scores, L, w.bt.data());
    for (int t = 0; t < L; ++t)
        for (int c = 0; c < L; ++c) d_scores[int64_t(t) * L + c] += dqn[t];
    block_gemm(true, false, L, Dv, L, scores, L, dnum, Dv, false, dv, Dv, w.bt.data());
    for (int64_t i = 0; i < int64_t(L) * L; ++i) d_qk[i] = d_scores[i] * d[i];
    block_gemm(false, false, L, Dk, L, d_qk, L, k, Dk, true, dq, Dk, w.bt.data());
    block_gemm(true, false, L, Dk, L, d_qk, L, q, Dk, false, dk, Dk, w.bt.data());

    // d = exp(log D - m): d loss / d log D = d_scores * scores (kept in d_scores).
    float* g = d_scores;
    for (int64_t i = 0; i < int64_t(L) * L; ++i) g[i] *= scores[i];
    for (int t = 0; t < L; ++t) {
        const float* gr = g + int64_t(t) * L;
        float row = 0.0f;
        for (int c = 0; c < L; ++c) row += gr[c];
        d_lw0[t] = dw0[t] * w0[t];
        dm[t] -= row + d_lw0[t];
    }
    // m = maximum(amax_s log D, log w0): dm goes to the maximal terms (x == 0), halves at a tie between the
    // two arguments, evenly among equal maxima inside amax.
    for (int t = 0; t < L; ++t) {
        const float* xr = x + int64_t(t) * L;
        int count = 0;
        for (int c = 0; c <= t; ++c) count += xr[c] == 0.0f;
        const bool amax_wins = count > 0, w0_wins = w.lw0x[t] == 0.0f;
        const float split = amax_wins && w0_wins ? dm[t] / 2 : dm[t];
        if (amax_wins) {
            const float share = split / count;
            float* gr = g + int64_t(t) * L;
            for (int c = 0; c <= t; ++c)
                if (xr[c] == 0.0f) gr[c] += share;
        }
        if (w0_wins) d_lw0[t] += split;
    }
    // log D_ts = sum_{s<r<=t} log f_r + log i_s: dlog_i_s = column sums; dlog_f_r = sum_{t>=r} sum_{s<r} g_ts
    // (row prefix sums, plain sums), plus the initial state's log weight sum_{r<=t} log f_r + m0.
    std::fill(dlog_i, dlog_i + L, 0.0f);
    double* below = w.below.data();  // below[c] = sum_{t>c} sum_{s<=c} g_ts
    std::fill(below, below + L, 0.0);
    for (int t = 0; t < L; ++t) {
        const float* gr = g + int64_t(t) * L;
        float prefix = 0.0f;
        for (int c = 0; c < t; ++c) {
            dlog_i[c] += gr[c];
            prefix += gr[c];
            below[c] += prefix;
        }
        dlog_i[t] += gr[t];
    }
    double suffix = 0.0, dm0 = 0.0;
    for (int r = L - 1; r >= 0; --r) {
        suffix += d_lw0[r];
        dlog_f[r] = static_cast<float>(suffix) + (r > 0 ? static_cast<float>(below[r - 1]) : 0.0f);
        dm0 += d_lw0[r];
    }
    p.dm0[b] = static_cast<float>(dm0);
}

template <typename P>
void run_blocks(const P& p, void (*block)(const P&, int64_t, Workspace&), bool backward, int64_t threads) {
    xlstm_zoo::parallel_rows(p.s.blocks, threads, [&]() {
        return [&p, block, w = Workspace(p.s, backward)](int64_t b) mutable { block(p, b, w); };
    });
}

}  // namespace

extern "C" {

void xlstm_zoo_mlstm_chunk_forward_f32(const float* q, const float* k, const float* v, const float* log_i,
                                       const float* log_f, const float* C0, const float* n0, const float* m0,
                                       float* h, float* m, float* qn, float* den, int64_t blocks, int64_t L,
                                       int64_t Dk, int64_t Dv, float eps, int64_t threads) {
    const Forward p{{blocks, L, Dk, Dv, eps}, q, k, v, log_i, log_f, C0, n0, m0, h, m, qn, den};
    run_blocks(p, forward_block, false, threads);
}

void xlstm_zoo_mlstm_chunk_backward_f32(const float* q, const float* k, const float* v, const float* log_i,
                                        const float* log_f, const float* C0, const float* n0, const float* m0,
                                        const float* h, const float* qn, const float* den,
                                        const float* dh, float* dq, float* dk, float* dv, float* dlog_i,
                                        float* dlog_f, float* dC0, float* dn0, float* dm0, int64_t blocks,
                                        int64_t L, int64_t Dk, int64_t Dv, float eps, int64_t threads) {
    const Backward p{{blocks, L, Dk, Dv, eps}, q, k, v, log_i, log_f, C0, n0, m0, h, qn, den, dh,
                     dq, dk, dv, dlog_i, dlog_f, dC0, dn0, dm0};
    run_blocks(p, backward_block, true, threads);
}

}  // extern "C"
