// The mLSTM chunkwise form's two per-chunk steps, forward and backward, one (batch-head, chunk) block at a
// time: the chunk sums (a chunk's keys and values summed into a state) and the intra-chunk core (a chunk's
// outputs from its entering state). And the whole form, one (batch, head) row per thread, chunk after chunk
// (Sequence, below), which the op uses where there are at least as many rows as threads.
//
// The PyTorch core (backends/reference/mlstm/chunkwise_backward.py) runs each step over all blocks at
// once: every [L, L] intermediate is a 4 MiB tensor at B=4 H=4 T=1024 L=64, so each of its ~35 passes
// and 13 batched matmuls streams through memory. Here a thread takes one block, keeps its [L, L]
// matrices (16 KiB each at L=64) in its own cache for the whole chain and multiplies its small matrices
// in place (block_gemm.h). For the backward the forward keeps one [L, L] tensor per block, the scores
// (a product to recompute), and the backward recomputes the decay matrix from the gates (the reference
// core keeps three [L, L] tensors).
//
// The maths, including where the function is not smooth (ties of the stabiliser's maxima, the readout
// floor), is that of chunkwise_backward.py and parallel.py; the Python side's docstrings say why.
// Layout per block: q, k [L, Dk], v [L, Dv], log_i, log_f [L], C0 [Dk, Dv], n0 [Dk], m0 [1]; row-major.
//
// Packed rows (the whole form only): `starts` [L] per chunk (null: none) marks where a document begins from
// the zero state (C = n = 0, m = 0). Within a chunk a row's decay matrix spans its own document's columns, its
// initial-state term is the chunk's entering state only before the chunk's first start (else the zero state:
// weight 0, stabiliser 0), and only the chunk's last document reaches the state after it.
#include "block_gemm.h"
#include "loops.h"

namespace {

using xlstm_zoo::block_gemm;  // the blocks' small matrix products (block_gemm.h)

constexpr float kFloorLogMax = 80.0f;  // readout floor exp(-m), -m clamped here (step.py: FLOOR_LOG_MAX)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Sizes {
    int64_t blocks, L, Dk, Dv;
    float eps;
};

// The block's decay matrix: x = log D - m (row stabiliser m), d = exp(x) (0 above the diagonal and left of
// the row's document), and the initial state's log weight minus m (lw0x) and weight (w0, 0 in a document
// begun in the chunk). Returns nothing; fills the buffers.
void decay(const Sizes& s, const float* log_i, const float* log_f, float m0, float* x, float* d, float* m,
           float* lw0x, float* w0, double* seg, const uint8_t* starts) {
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
    double acc = 0.0;  // the initial (or zero) state's log decay, summed from its document's start
    int64_t first = 0;  // the row's first column in its document
    bool fresh = false;  // a document began in the chunk at or before the row: the zero state is its initial one
    for (int64_t t = 0; t < L; ++t) {
        if (starts && starts[t]) acc = 0.0, first = t, fresh = true;
        acc += log_f[t];
        const float log_w0 = static_cast<float>(acc) + (fresh ? 0.0f : m0);
        float* xr = x + t * L;
        const float mt = xlstm_zoo::nan_max(xlstm_zoo::nan_max_over(xr + first, t + 1 - first, kNegInf), log_w0);
        m[t] = mt;
        float* dr = d + t * L;
        for (int64_t c = 0; c < first; ++c) {
            xr[c] = kNegInf;
            dr[c] = 0.0f;
        }
        XLSTM_ZOO_SIMD
        for (int64_t c = first; c <= t; ++c) {
            xr[c] -= mt;
            dr[c] = xlstm_zoo::vexp(xr[c]);
        }
        for (int64_t c = t + 1; c < L; ++c) {
            xr[c] = kNegInf;
            dr[c] = 0.0f;
        }
        lw0x[t] = log_w0 - mt;
        w0[t] = fresh ? 0.0f : std::exp(lw0x[t]);
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
    float *h, *qn, *den;  // outputs: h [L, Dv]; q.n and the readout's denominator [L] (for the backward)
    float* scores;            // optional output [L, L] (null: not kept)
};

// One thread's buffers, reused for each of its blocks (the backward's on top of the forward's).
struct Workspace {
    std::vector<float> x, d, scores, lw0x, w0, q_n0, m;
    std::vector<float> G;   // [L, Dk]: the backward's dnum C0^T; the chunk sums' weighted keys
    std::vector<float> bt;  // a transposed right-hand factor (block_gemm's scratch)
    std::vector<float> dnum, dqn, dm, dw0, d_lw0, d_scores, d_qk, dq_c0;
    std::vector<double> seg, col_sums;
    Workspace(const Sizes& s, bool backward)
        : x(s.L * s.L), d(s.L * s.L), scores(s.L * s.L), lw0x(s.L), w0(s.L), q_n0(s.L), m(s.L),
          G(s.L * s.Dk), bt(std::max({s.L, s.Dk, s.Dv}) * std::max({s.L, s.Dk, s.Dv})), seg(s.L) {
        if (!backward) return;
        const int64_t L = s.L;
        dnum.resize(L * s.Dv), dqn.resize(L), dm.resize(L), dw0.resize(L), d_lw0.resize(L);
        d_scores.resize(L * L), d_qk.resize(L * L), dq_c0.resize(L * s.Dv), col_sums.resize(L);
    }
};

// Scores (q k^T) * d into `scores` [L, L] (the forward's; the backward reads them back).
void compute_scores(const Sizes& s, const float* q, const float* k, float* scores, Workspace& w) {
    block_gemm(false, true, s.L, s.L, s.Dk, q, s.Dk, k, s.Dk, false, scores, s.L, w.bt.data());
    for (int64_t i = 0; i < s.L * s.L; ++i) scores[i] *= w.d[i];
}

// q . n0 for each row (the initial state's term of the normaliser); n0 null: the zero state.
void state_terms(const Sizes& s, const float* q, const float* n0, Workspace& w) {
    for (int t = 0; t < s.L; ++t) w.q_n0[t] = n0 ? dot(n0, q + t * s.Dk, s.Dk) : 0.0f;
}

// One chunk's outputs from its entering state (C0, n0, m0): h [L, Dv], and the readout's q.n and
// denominator [L] and the scores [L, L] that the backward reads. C0 and n0 null: the zero state (a sequence's
// first chunk without an initial state), whose q C0 term is skipped: it is 0 and costs as much as the rest.
void chunk_forward(const Sizes& s, const float* q, const float* k, const float* v, const float* log_i,
                   const float* log_f, const float* C0, const float* n0, float m0, float* h, float* qn, float* den,
                   float* scores, Workspace& w, const uint8_t* starts = nullptr) {
    const int L = s.L, Dk = s.Dk, Dv = s.Dv;
    float* m = w.m.data();
    decay(s, log_i, log_f, m0, w.x.data(), w.d.data(), m, w.lw0x.data(), w.w0.data(), w.seg.data(), starts);
    compute_scores(s, q, k, scores, w);
    state_terms(s, q, n0, w);
    // num = w0 * (q C0) + scores v, accumulated in h
    if (C0) {
        block_gemm(false, false, L, Dv, Dk, q, Dk, C0, Dv, false, h, Dv, w.bt.data());
        for (int t = 0; t < L; ++t) {
            float* hr = h + int64_t(t) * Dv;
            const float w0 = w.w0[t];
            XLSTM_ZOO_SIMD
            for (int j = 0; j < Dv; ++j) hr[j] *= w0;
        }
    }
    block_gemm(false, false, L, Dv, L, scores, L, v, Dv, C0 != nullptr, h, Dv, w.bt.data());
    for (int t = 0; t < L; ++t) {
        const float* sr = scores + int64_t(t) * L;
        float row = 0.0f;
        XLSTM_ZOO_SIMD_REDUCE(+ : row)
        for (int c = 0; c < L; ++c) row += sr[c];
        qn[t] = row + w.w0[t] * w.q_n0[t];
        const float d = xlstm_zoo::nan_max(std::abs(qn[t]), readout_floor(m[t])) + s.eps;
        den[t] = d;
        float* hr = h + int64_t(t) * Dv;
        XLSTM_ZOO_SIMD
        for (int j = 0; j < Dv; ++j) hr[j] /= d;
    }
}

void forward_block(const Forward& p, int64_t b, Workspace& w) {
    const Sizes& s = p.s;
    const int64_t L = s.L, Dk = s.Dk, Dv = s.Dv;
    float* scores = p.scores ? p.scores + b * L * L : w.scores.data();  // kept for the backward when asked
    chunk_forward(s, p.q + b * L * Dk, p.k + b * L * Dk, p.v + b * L * Dv, p.log_i + b * L, p.log_f + b * L,
                  p.C0 + b * Dk * Dv, p.n0 + b * Dk, p.m0[b], p.h + b * L * Dv, p.qn + b * L, p.den + b * L, scores,
                  w);
}

struct Backward {
    Sizes s;
    const float *q, *k, *v, *log_i, *log_f, *C0, *n0, *m0, *h, *qn, *den, *dh;
    const float* scores;  // the forward's [L, L] per block
    float *dq, *dk, *dv, *dlog_i, *dlog_f, *dC0, *dn0, *dm0;
    const uint8_t* starts = nullptr;  // the chunk's document starts [L] (null: none)
};

// The pointers of block b of a call's blocks (each block's tensors stored one after another).
Backward at_block(Backward p, int64_t b) {
    const int64_t L = p.s.L, Dk = p.s.Dk, Dv = p.s.Dv;
    for (const float** x : {&p.q, &p.k}) *x += b * L * Dk;
    for (const float** x : {&p.v, &p.h, &p.dh}) *x += b * L * Dv;
    for (const float** x : {&p.log_i, &p.log_f, &p.qn, &p.den}) *x += b * L;
    p.C0 += b * Dk * Dv, p.n0 += b * Dk, p.m0 += b, p.scores += b * L * L;
    p.dq += b * L * Dk, p.dk += b * L * Dk, p.dv += b * L * Dv, p.dlog_i += b * L, p.dlog_f += b * L;
    p.dC0 += b * Dk * Dv, p.dn0 += b * Dk, p.dm0 += b;
    return p;
}

// One chunk's backward (p: that chunk's pointers); its gradients are written, not added. C0 and n0 null: the
// zero state (its terms are 0); dC0 and dn0 null: the entering state's gradient is not wanted (dm0 still is
// written).
void chunk_backward(const Backward& p, Workspace& w) {
    const Sizes& s = p.s;
    const int L = s.L, Dk = s.Dk, Dv = s.Dv;
    const float *q = p.q, *k = p.k, *v = p.v, *C0 = p.C0, *n0 = p.n0;
    const float *h = p.h, *qn = p.qn, *den = p.den, *dh = p.dh;
    float *dq = p.dq, *dk = p.dk, *dv = p.dv, *dlog_i = p.dlog_i, *dlog_f = p.dlog_f, *dC0 = p.dC0, *dn0 = p.dn0;
    float* m = w.m.data();  // the row stabiliser, recomputed as in the forward
    decay(s, p.log_i, p.log_f, p.m0[0], w.x.data(), w.d.data(), m, w.lw0x.data(), w.w0.data(), w.seg.data(),
          p.starts);
    const float* scores = p.scores;
    state_terms(s, q, n0, w);
    const float *x = w.x.data(), *d = w.d.data(), *w0 = w.w0.data();

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
    if (C0) {
        float* G = w.G.data();
        block_gemm(false, true, L, Dk, Dv, dnum, Dv, C0, Dv, false, G, Dk, w.bt.data());
        for (int t = 0; t < L; ++t) {
            const float* qr = q + int64_t(t) * Dk;
            const float* gr = G + int64_t(t) * Dk;
            dw0[t] = dot(qr, gr, Dk) + dqn[t] * w.q_n0[t];
            const float dq_n0 = dqn[t] * w0[t];
            float* dqr = dq + int64_t(t) * Dk;
            for (int i = 0; i < Dk; ++i) dqr[i] = w0[t] * gr[i] + dq_n0 * n0[i];
        }
    } else {
        std::fill(dw0, dw0 + L, 0.0f);
        std::fill(dq, dq + int64_t(L) * Dk, 0.0f);
    }
    if (dC0) {
        std::fill(dn0, dn0 + Dk, 0.0f);
        for (int t = 0; t < L; ++t) {
            const float* qr = q + int64_t(t) * Dk;
            const float dq_n0 = dqn[t] * w0[t];
            for (int i = 0; i < Dk; ++i) dn0[i] += dq_n0 * qr[i];
        }
        float* dq_c0 = w.dq_c0.data();
        for (int t = 0; t < L; ++t)
            for (int j = 0; j < Dv; ++j) dq_c0[int64_t(t) * Dv + j] = w0[t] * dnum[int64_t(t) * Dv + j];
        block_gemm(true, false, Dk, Dv, L, q, Dk, dq_c0, Dv, false, dC0, Dv, w.bt.data());
    }

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
        XLSTM_ZOO_SIMD_REDUCE(+ : row)
        for (int c = 0; c < L; ++c) row += gr[c];
        d_lw0[t] = dw0[t] * w0[t];
        dm[t] -= row + d_lw0[t];
    }
    // m = maximum(amax_s log D, log w0): dm goes to the maximal terms (x == 0), halves at a tie between the
    // two arguments, evenly among equal maxima inside amax.
    for (int t = 0; t < L; ++t) {
        const float* xr = x + int64_t(t) * L;
        int count = 0;
        XLSTM_ZOO_SIMD_REDUCE(+ : count)
        for (int c = 0; c <= t; ++c) count += xr[c] == 0.0f;
        const bool amax_wins = count > 0, w0_wins = w.lw0x[t] == 0.0f;
        const float split = amax_wins && w0_wins ? dm[t] / 2 : dm[t];
        if (amax_wins) {
            const float share = split / count;
            float* gr = g + int64_t(t) * L;
            XLSTM_ZOO_SIMD
            for (int c = 0; c <= t; ++c) gr[c] += xr[c] == 0.0f ? share : 0.0f;
        }
        if (w0_wins) d_lw0[t] += split;
    }
    // log D_ts = sum_{s<r<=t} log f_r + log i_s: dlog_i_s = sum_t g_ts; dlog_f_r = sum_{t>=r} sum_{s<r} g_ts,
    // plus the initial state's log weight sum_{r<=t} log f_r + m0. Both from the column sums over the rows
    // t >= r, U_s = sum_{t>=r} g_ts, taken row by row from the bottom (plain sums, vectorised over s).
    // With documents a row's initial weight sums log f from its document's start (the suffix restarts above
    // each start), and m0 is in the rows before the chunk's first start only.
    double* U = w.col_sums.data();
    std::fill(U, U + L, 0.0);
    double suffix = 0.0, dm0 = 0.0;
    int first_start = L;
    for (int r = 0; p.starts && r < L; ++r)
        if (p.starts[r]) {
            first_start = r;
            break;
        }
    for (int r = L - 1; r >= 0; --r) {
        const float* gr = g + int64_t(r) * L;
        XLSTM_ZOO_SIMD
        for (int c = 0; c <= r; ++c) U[c] += gr[c];
        double left = 0.0;  // sum_{s<r} U_s
        XLSTM_ZOO_SIMD_REDUCE(+ : left)
        for (int c = 0; c < r; ++c) left += U[c];
        suffix += d_lw0[r];
        dlog_f[r] = static_cast<float>(suffix + left);
        if (r < first_start) dm0 += d_lw0[r];
        if (p.starts && p.starts[r]) suffix = 0.0;
    }
    for (int c = 0; c < L; ++c) dlog_i[c] = static_cast<float>(U[c]);
    p.dm0[0] = static_cast<float>(dm0);
}

void backward_block(const Backward& p, int64_t b, Workspace& w) { chunk_backward(at_block(p, b), w); }

// Chunk sums (chunkwise_backward.py's _ChunkSums): C = (a k)^T v [Dk, Dv] and n = sum_t a_t k_t [Dk] per
// block, and their backward: with dk_w = v dC^T + dn, dk = a dk_w, dv = (a k) dC, da_t = dk_w[t] . k[t].
struct Sums {
    Sizes s;
    const float *k, *v, *a, *dC, *dn;
    float *C, *n, *dk, *dv, *da;
};

void sums_forward_block(const Sums& p, int64_t b, Workspace& w) {
    const int L = p.s.L, Dk = p.s.Dk, Dv = p.s.Dv;
    const float *k = p.k + b * L * Dk, *a = p.a + b * L;
    float* k_w = w.G.data();
    float* n = p.n + b * Dk;
    std::fill(n, n + Dk, 0.0f);
    for (int t = 0; t < L; ++t)
        for (int i = 0; i < Dk; ++i) {
            k_w[int64_t(t) * Dk + i] = a[t] * k[int64_t(t) * Dk + i];
            n[i] += k_w[int64_t(t) * Dk + i];
        }
    block_gemm(true, false, Dk, Dv, L, k_w, Dk, p.v + b * L * Dv, Dv, false, p.C + b * Dk * Dv, Dv, w.bt.data());
}

void sums_backward_block(const Sums& p, int64_t b, Workspace& w) {
    const int L = p.s.L, Dk = p.s.Dk, Dv = p.s.Dv;
    const float *k = p.k + b * L * Dk, *v = p.v + b * L * Dv, *a = p.a + b * L;
    const float *dC = p.dC + b * Dk * Dv, *dn = p.dn + b * Dk;
    float *dk = p.dk + b * L * Dk, *da = p.da + b * L;
    float* k_w = w.G.data();
    for (int t = 0; t < L; ++t)
        for (int i = 0; i < Dk; ++i) k_w[int64_t(t) * Dk + i] = a[t] * k[int64_t(t) * Dk + i];
    block_gemm(false, false, L, Dv, Dk, k_w, Dk, dC, Dv, false, p.dv + b * L * Dv, Dv, w.bt.data());
    for (int t = 0; t < L; ++t) std::copy(dn, dn + Dk, dk + int64_t(t) * Dk);  // dk_w, built in dk
    block_gemm(false, true, L, Dk, Dv, v, Dv, dC, Dv, true, dk, Dk, w.bt.data());
    for (int t = 0; t < L; ++t) {
        float* row = dk + int64_t(t) * Dk;
        da[t] = dot(row, k + int64_t(t) * Dk, Dk);
        for (int i = 0; i < Dk; ++i) row[i] *= a[t];
    }
}

// The whole chunkwise form for one (batch, head) row at a time: one thread walks the row's chunks in
// order, each chunk's outputs from the running state, then the state carried over the chunk
// (C <- f C + sum_t a_t k_t v_t^T, stabilised as in chunkwise.py). The PyTorch chunkwise form computes all
// entering states at once as a chunk-level parallel form, in ~25 small ops that stream the states through
// memory (a third of the op's time at the 7B layout's d=256 sizes); here they stay in the thread's cache.
// q, k and v are read in place from strided [B, H, T, D] views (the projections' [B, T, H*D] outputs),
// one chunk at a time into contiguous buffers, q times its scale on the way in.
//
// For training the forward also keeps what the backward reads: each chunk's entering state, its scores and
// the readout's q.n and denominator. The backward walks the chunks in reverse with the gradient of the
// running state: each chunk's core backward (chunk_backward) and its carry step backwards, the entering
// state's gradient the sum of the two.
struct Sequence {
    Sizes s;  // blocks = rows (B * H), L = chunk size
    int64_t heads, T;
    const float *q, *k, *v;
    int64_t q_stride[3], k_stride[3], v_stride[3];  // batch, head, time (the feature stride is 1)
    float scale;
    const float *log_i, *log_f;  // [rows, T]
    const float *C0, *n0, *m0;   // the initial state (null: the zero state)
    bool zero_state;             // the backward's: the forward ran from the zero state
    float *h;                    // [rows, T, Dv]
    float *C, *n, *m;            // the final state (the running one during the forward)
    // Kept for the backward (null: inference): per chunk the entering state [rows, NC, Dk(, Dv)] / [rows, NC]
    // and scores [rows, NC, L, L]; per token the readout's q.n and denominator [rows, T].
    float *C_in, *n_in, *m_in, *scores, *qn, *den;
    // The backward's inputs (dC, dn, dm: the final state's gradients, null for none) and outputs (dq, dk,
    // dv contiguous [rows, T, D]; dlog_i, dlog_f [rows, T]; the initial state's, null: not wanted).
    const float *dh, *dC, *dn, *dm;
    float *dq, *dk, *dv, *dlog_i, *dlog_f, *dC0, *dn0, *dm0;
    const uint8_t* starts;  // document starts [B, T] (null: none), the same for every head of a batch row

    int64_t chunks() const { return (T + s.L - 1) / s.L; }
    const uint8_t* chunk_starts(int64_t row, int64_t t0) const { return starts ? starts + row / heads * T + t0 : nullptr; }
};

struct SequenceWorkspace {
    Workspace w;
    std::vector<float> q, k, v, qn, den, log_a, e;
    std::vector<float> dC, dn, dq, dk, dv, dlog_i, dlog_f, dC0, dn0, u, d_log_a;  // the backward's
    SequenceWorkspace(const Sizes& s, bool backward)
        : w(s, backward), q(s.L * s.Dk), k(s.L * s.Dk), v(s.L * s.Dv), qn(s.L), den(s.L), log_a(s.L), e(s.L) {
        if (!backward) return;
        dC.resize(s.Dk * s.Dv), dn.resize(s.Dk), dq.resize(s.L * s.Dk), dk.resize(s.L * s.Dk);
        dv.resize(s.L * s.Dv), dlog_i.resize(s.L), dlog_f.resize(s.L), dC0.resize(s.Dk * s.Dv), dn0.resize(s.Dk);
        u.resize(s.L * s.Dk), d_log_a.resize(s.L);
    }
};

void gather_chunk(const float* x, const int64_t* stride, int64_t b, int64_t head, int64_t t0, int L, int D,
                  float scale, float* out) {
    const float* base = x + b * stride[0] + head * stride[1] + t0 * stride[2];
    for (int t = 0; t < L; ++t) {
        const float* row = base + t * stride[2];
        float* o = out + int64_t(t) * D;
        XLSTM_ZOO_SIMD
        for (int i = 0; i < D; ++i) o[i] = row[i] * scale;
    }
}

// The carry step's factors. With a_t = exp(log i_t + sum_{r>t} log f_r) and F = sum_r log f_r, the state
// after the chunk is m' = max(m + F, max_t log a_t), C' = keep C + sum_t e_t k_t v_t^T (n' likewise) with
// keep = exp(m + F - m') and e_t = exp(log a_t - m'). log_a and e are left in the workspace. A chunk with a
// document start (`first`: its last one, 0 for none) carries the zero state (m 0, keep 0) into its last
// document, which alone reaches the state after it: F and the a_t run over t >= first, e_t = 0 before.
struct Carry {
    float decayed, a_max, m_new, keep;
    int first;     // the first position that reaches the state after the chunk
    bool started;  // a document starts in the chunk: the entering state does not reach the state after it
};

Carry carry_factors(int L, const float* log_i, const float* log_f, float m, SequenceWorkspace& sw,
                    const uint8_t* starts) {
    Carry c;
    c.first = 0, c.started = false;
    for (int t = L - 1; starts && t >= 0; --t)
        if (starts[t]) {
            c.first = t, c.started = true;
            break;
        }
    float* log_a = sw.log_a.data();
    double to_end = 0.0;  // suffix sums in double, as decay() and torch's cumsum
    float a_max = kNegInf;
    for (int t = L - 1; t >= c.first; --t) {
        log_a[t] = static_cast<float>(to_end) + log_i[t];
        a_max = xlstm_zoo::nan_max(a_max, log_a[t]);
        to_end += log_f[t];
    }
    for (int t = 0; t < c.first; ++t) log_a[t] = kNegInf;
    c.decayed = (c.started ? 0.0f : m) + static_cast<float>(to_end);
    c.a_max = a_max;
    c.m_new = xlstm_zoo::nan_max(c.decayed, a_max);
    c.keep = c.started ? 0.0f : std::exp(c.decayed - c.m_new);
    for (int t = 0; t < L; ++t) sw.e[t] = std::exp(log_a[t] - c.m_new);
    return c;
}

void carry_state(const Sizes& s, const float* k, const float* v, const float* log_i, const float* log_f, float* C,
                 float* n, float& m, SequenceWorkspace& sw, const uint8_t* starts) {
    const int L = s.L, Dk = s.Dk, Dv = s.Dv;
    const Carry c = carry_factors(L, log_i, log_f, m, sw, starts);
    float* k_w = sw.w.G.data();
    for (int i = 0; i < Dk; ++i) n[i] *= c.keep;
    for (int t = 0; t < L; ++t) {
        const float* kr = k + int64_t(t) * Dk;
        float* kw = k_w + int64_t(t) * Dk;
        for (int i = 0; i < Dk; ++i) {
            kw[i] = sw.e[t] * kr[i];
            n[i] += kw[i];
        }
    }
    block_gemm(true, false, Dk, Dv, L, k_w, Dk, v, Dv, true, C, Dv, sw.w.bt.data(), c.keep);  // keep C + ...
    m = c.m_new;
}

// The carry step backwards, from the gradients (dC, dn, dm) of the state after the chunk (replaced by those
// of the state before it: C, n its values, m its stabiliser). Adds to the chunk's dk, dv, dlog_i, dlog_f.
void carry_backward(const Sizes& s, const float* k, const float* v, const float* log_i, const float* log_f,
                    const float* C, const float* n, float m, float* dC, float* dn, float& dm, float* dk, float* dv,
                    float* dlog_i, float* dlog_f, SequenceWorkspace& sw, const uint8_t* starts) {
    const int L = s.L, Dk = s.Dk, Dv = s.Dv;
    const Carry c = carry_factors(L, log_i, log_f, m, sw, starts);
    const float *e = sw.e.data(), *log_a = sw.log_a.data();
    float d_keep = dot(dn, n, Dk);
    XLSTM_ZOO_SIMD_REDUCE(+ : d_keep)
    for (int64_t i = 0; i < int64_t(Dk) * Dv; ++i) d_keep += dC[i] * C[i];
    // u_t = dC' v_t + dn' [L, Dk]: d e_t = k_t . u_t, dk_t += e_t u_t, dv_t += e_t k_t^T dC'.
    float *u = sw.u.data(), *d_log_a = sw.d_log_a.data(), *k_w = sw.w.G.data();
    for (int t = 0; t < L; ++t) std::copy(dn, dn + Dk, u + int64_t(t) * Dk);
    block_gemm(false, true, L, Dk, Dv, v, Dv, dC, Dv, true, u, Dk, sw.w.bt.data());
    float dm_new = dm;
    for (int t = 0; t < L; ++t) {
        const float* ur = u + int64_t(t) * Dk;
        const float* kr = k + int64_t(t) * Dk;
        float* dkr = dk + int64_t(t) * Dk;
        float* kw = k_w + int64_t(t) * Dk;
        d_log_a[t] = dot(kr, ur, Dk) * e[t];  // e_t = exp(log a_t - m')
        dm_new -= d_log_a[t];
        for (int i = 0; i < Dk; ++i) {
            dkr[i] += e[t] * ur[i];
            kw[i] = e[t] * kr[i];
        }
    }
    block_gemm(false, false, L, Dv, Dk, k_w, Dk, dC, Dv, true, dv, Dv, sw.w.bt.data());
    float d_decayed = d_keep * c.keep;  // keep = exp(m + F - m')
    dm_new -= d_decayed;
    // m' = maximum(m + F, amax_t log a_t): half each at a tie (torch.maximum), evenly among equal maxima.
    const bool decayed_wins = c.decayed == c.m_new, amax_wins = c.a_max == c.m_new;
    const float split = decayed_wins && amax_wins ? dm_new / 2 : dm_new;
    if (decayed_wins) d_decayed += split;
    if (amax_wins) {
        int count = 0;
        for (int t = 0; t < L; ++t) count += log_a[t] == c.a_max;
        for (int t = 0; t < L; ++t) d_log_a[t] += log_a[t] == c.a_max ? split / count : 0.0f;
    }
    // log a_t = log i_t + sum_{r>t} log f_r; m + F = m + sum_r log f_r (both over r >= first; d log a_t = 0
    // before first).
    double below = 0.0;  // sum_{t<r} d log a_t
    for (int r = 0; r < L; ++r) {
        dlog_i[r] += d_log_a[r];
        dlog_f[r] += static_cast<float>(below) + (r >= c.first ? d_decayed : 0.0f);
        below += d_log_a[r];
    }
    XLSTM_ZOO_SIMD
    for (int64_t i = 0; i < int64_t(Dk) * Dv; ++i) dC[i] *= c.keep;
    for (int i = 0; i < Dk; ++i) dn[i] *= c.keep;
    dm = c.started ? 0.0f : d_decayed;  // after a start the entering m is not in m + F
}

void gather_row_chunk(const Sequence& p, int64_t row, int64_t t0, int L, SequenceWorkspace& sw) {
    const int64_t b = row / p.heads, head = row % p.heads;
    gather_chunk(p.q, p.q_stride, b, head, t0, L, p.s.Dk, p.scale, sw.q.data());
    gather_chunk(p.k, p.k_stride, b, head, t0, L, p.s.Dk, 1.0f, sw.k.data());
    gather_chunk(p.v, p.v_stride, b, head, t0, L, p.s.Dv, 1.0f, sw.v.data());
}

void sequence_row(const Sequence& p, int64_t row, SequenceWorkspace& sw) {
    const int64_t Dk = p.s.Dk, Dv = p.s.Dv, T = p.T, NC = p.chunks(), L_full = p.s.L;
    float *C = p.C + row * Dk * Dv, *n = p.n + row * Dk;
    float m = 0.0f;
    if (p.C0) {
        std::copy(p.C0 + row * Dk * Dv, p.C0 + (row + 1) * Dk * Dv, C);
        std::copy(p.n0 + row * Dk, p.n0 + (row + 1) * Dk, n);
        m = p.m0[row];
    } else {
        std::fill(C, C + Dk * Dv, 0.0f);
        std::fill(n, n + Dk, 0.0f);
    }
    const float *log_i = p.log_i + row * T, *log_f = p.log_f + row * T;
    const bool keep = p.C_in != nullptr;
    for (int64_t c = 0; c < NC; ++c) {
        const int64_t t0 = c * L_full, at = row * NC + c;
        const Sizes s{1, std::min(L_full, T - t0), Dk, Dv, p.s.eps};  // the last chunk may be shorter
        gather_row_chunk(p, row, t0, static_cast<int>(s.L), sw);
        if (keep) {
            std::copy(C, C + Dk * Dv, p.C_in + at * Dk * Dv);
            std::copy(n, n + Dk, p.n_in + at * Dk);
            p.m_in[at] = m;
        }
        const uint8_t* starts = p.chunk_starts(row, t0);
        const bool zero = c == 0 && !p.C0;  // the zero state entering: its terms are skipped
        chunk_forward(s, sw.q.data(), sw.k.data(), sw.v.data(), log_i + t0, log_f + t0, zero ? nullptr : C,
                      zero ? nullptr : n, m,
                      p.h + (row * T + t0) * Dv, keep ? p.qn + row * T + t0 : sw.qn.data(),
                      keep ? p.den + row * T + t0 : sw.den.data(),
                      keep ? p.scores + at * L_full * L_full : sw.w.scores.data(), sw.w, starts);
        carry_state(s, sw.k.data(), sw.v.data(), log_i + t0, log_f + t0, C, n, m, sw, starts);
    }
    p.m[row] = m;
}

void sequence_backward_row(const Sequence& p, int64_t row, SequenceWorkspace& sw) {
    const int64_t Dk = p.s.Dk, Dv = p.s.Dv, T = p.T, NC = p.chunks(), L_full = p.s.L;
    float *dC = sw.dC.data(), *dn = sw.dn.data();
    if (p.dC) std::copy(p.dC + row * Dk * Dv, p.dC + (row + 1) * Dk * Dv, dC);
    else std::fill(dC, dC + Dk * Dv, 0.0f);
    if (p.dn) std::copy(p.dn + row * Dk, p.dn + (row + 1) * Dk, dn);
    else std::fill(dn, dn + Dk, 0.0f);
    float dm = p.dm ? p.dm[row] : 0.0f;
    // No gradient on the final state: the last chunk's carry step adds exact zeros, so it is skipped.
    const bool final_grad = p.dC || p.dn || p.dm;
    const float *log_i = p.log_i + row * T, *log_f = p.log_f + row * T;
    for (int64_t c = NC - 1; c >= 0; --c) {
        const int64_t t0 = c * L_full, at = row * NC + c;
        const Sizes s{1, std::min(L_full, T - t0), Dk, Dv, p.s.eps};
        const int L = static_cast<int>(s.L);
        gather_row_chunk(p, row, t0, L, sw);
        const float *C_in = p.C_in + at * Dk * Dv, *n_in = p.n_in + at * Dk;
        // The core first (its gradients are written), then the carry's added; the entering state's
        // gradient is the core's plus the carry's.
        float dm0 = 0.0f;
        const uint8_t* starts = p.chunk_starts(row, t0);
        const bool zero = c == 0 && p.zero_state;      // the zero state entered: its terms are 0
        const bool entering = c > 0 || p.dC0;          // the entering state's gradient is wanted
        const Backward b{s, sw.q.data(), sw.k.data(), sw.v.data(), log_i + t0, log_f + t0, zero ? nullptr : C_in,
                         zero ? nullptr : n_in, p.m_in + at, p.h + (row * T + t0) * Dv, p.qn + row * T + t0,
                         p.den + row * T + t0, p.dh + (row * T + t0) * Dv, p.scores + at * L_full * L_full,
                         sw.dq.data(), sw.dk.data(), sw.dv.data(), sw.dlog_i.data(), sw.dlog_f.data(),
                         entering ? sw.dC0.data() : nullptr, entering ? sw.dn0.data() : nullptr, &dm0, starts};
        chunk_backward(b, sw.w);
        if (c < NC - 1 || final_grad)  // earlier chunks carry the later ones' entering-state gradients
            carry_backward(s, sw.k.data(), sw.v.data(), log_i + t0, log_f + t0, C_in, n_in, p.m_in[at], dC, dn, dm,
                           sw.dk.data(), sw.dv.data(), sw.dlog_i.data(), sw.dlog_f.data(), sw, starts);
        if (entering) {
            for (int64_t i = 0; i < Dk * Dv; ++i) dC[i] += sw.dC0[i];
            for (int64_t i = 0; i < Dk; ++i) dn[i] += sw.dn0[i];
        }
        dm += dm0;
        float* dq = p.dq + (row * T + t0) * Dk;
        for (int64_t i = 0; i < L * Dk; ++i) dq[i] = sw.dq[i] * p.scale;  // q entered times its scale
        std::copy(sw.dk.begin(), sw.dk.begin() + L * Dk, p.dk + (row * T + t0) * Dk);
        std::copy(sw.dv.begin(), sw.dv.begin() + L * Dv, p.dv + (row * T + t0) * Dv);
        std::copy(sw.dlog_i.begin(), sw.dlog_i.begin() + L, p.dlog_i + row * T + t0);
        std::copy(sw.dlog_f.begin(), sw.dlog_f.begin() + L, p.dlog_f + row * T + t0);
    }
    if (!p.dC0) return;
    std::copy(dC, dC + Dk * Dv, p.dC0 + row * Dk * Dv);
    std::copy(dn, dn + Dk, p.dn0 + row * Dk);
    p.dm0[row] = dm;
}

// Sequence.q, k, v and their strides (q, k, v: batch, head and time each), sizes and settings, the rest null.
Sequence sequence_call(const float* q, const float* k, const float* v, const int64_t* strides, const float* log_i,
                       const float* log_f, const uint8_t* starts, int64_t batch, int64_t heads, int64_t T, int64_t L,
                       int64_t Dk, int64_t Dv, float scale, float eps) {
    Sequence p{};
    p.s = {batch * heads, L, Dk, Dv, eps};
    p.heads = heads, p.T = T, p.q = q, p.k = k, p.v = v, p.scale = scale, p.log_i = log_i, p.log_f = log_f;
    p.starts = starts;
    std::copy(strides, strides + 3, p.q_stride);
    std::copy(strides + 3, strides + 6, p.k_stride);
    std::copy(strides + 6, strides + 9, p.v_stride);
    return p;
}

// p.s.blocks independent blocks (per-chunk blocks, or a Sequence's rows) over threads, each thread with its
// own workspace W(p.s, backward).
template <typename P, typename W>
void run_blocks(const P& p, void (*block)(const P&, int64_t, W&), bool backward, int64_t threads) {
    xlstm_zoo::parallel_rows(p.s.blocks, threads, [&]() {
        return [&p, block, w = W(p.s, backward)](int64_t b) mutable { block(p, b, w); };
    });
}

}  // namespace

extern "C" {

void xlstm_zoo_mlstm_chunk_forward_f32(const float* q, const float* k, const float* v, const float* log_i,
                                       const float* log_f, const float* C0, const float* n0, const float* m0,
                                       float* h, float* qn, float* den, float* scores, int64_t blocks,
                                       int64_t L, int64_t Dk, int64_t Dv, float eps, int64_t threads) {
    const Forward p{{blocks, L, Dk, Dv, eps}, q, k, v, log_i, log_f, C0, n0, m0, h, qn, den, scores};
    run_blocks(p, forward_block, false, threads);
}

// The forward; C0, n0, m0 null for the zero state; C_in .. den null for inference (nothing kept), else sized as
// Sequence says; starts [B, T] or null.
void xlstm_zoo_mlstm_sequence_forward_f32(const float* q, const float* k, const float* v, const int64_t* strides,
                                          const float* log_i, const float* log_f, const uint8_t* starts,
                                          const float* C0, const float* n0,
                                          const float* m0, float* h, float* C, float* n, float* m, float* C_in,
                                          float* n_in, float* m_in, float* scores, float* qn, float* den,
                                          int64_t batch, int64_t heads, int64_t T, int64_t L, int64_t Dk, int64_t Dv,
                                          float scale, float eps, int64_t threads) {
    Sequence p = sequence_call(q, k, v, strides, log_i, log_f, starts, batch, heads, T, L, Dk, Dv, scale, eps);
    p.C0 = C0, p.n0 = n0, p.m0 = m0, p.h = h, p.C = C, p.n = n, p.m = m;
    p.C_in = C_in, p.n_in = n_in, p.m_in = m_in, p.scores = scores, p.qn = qn, p.den = den;
    run_blocks(p, sequence_row, false, threads);
}

// The backward of a forward that kept C_in .. den; dC, dn, dm may be null (no gradient on the final state),
// dC0, dn0, dm0 too (none wanted on the initial one); zero_state: the forward ran from the zero state.
void xlstm_zoo_mlstm_sequence_backward_f32(const float* q, const float* k, const float* v, const int64_t* strides,
                                           const float* log_i, const float* log_f, const uint8_t* starts,
                                           const float* h, const float* C_in,
                                           const float* n_in, const float* m_in, const float* scores,
                                           const float* qn, const float* den, const float* dh, const float* dC,
                                           const float* dn, const float* dm, float* dq, float* dk, float* dv,
                                           float* dlog_i, float* dlog_f, float* dC0, float* dn0, float* dm0,
                                           int64_t batch, int64_t heads, int64_t T, int64_t L, int64_t Dk,
                                           int64_t Dv, int64_t zero_state, float scale, float eps, int64_t threads) {
    Sequence p = sequence_call(q, k, v, strides, log_i, log_f, starts, batch, heads, T, L, Dk, Dv, scale, eps);
    p.zero_state = zero_state != 0;
    p.h = const_cast<float*>(h);  // read only here
    p.C_in = const_cast<float*>(C_in), p.n_in = const_cast<float*>(n_in), p.m_in = const_cast<float*>(m_in);
    p.scores = const_cast<float*>(scores), p.qn = const_cast<float*>(qn), p.den = const_cast<float*>(den);
    p.dh = dh, p.dC = dC, p.dn = dn, p.dm = dm;
    p.dq = dq, p.dk = dk, p.dv = dv, p.dlog_i = dlog_i, p.dlog_f = dlog_f, p.dC0 = dC0, p.dn0 = dn0, p.dm0 = dm0;
    run_blocks(p, sequence_backward_row, true, threads);
}

void xlstm_zoo_mlstm_chunk_backward_f32(const float* q, const float* k, const float* v, const float* log_i,
                                        const float* log_f, const float* C0, const float* n0, const float* m0,
                                        const float* h, const float* qn, const float* den, const float* scores,
                                        const float* dh, float* dq, float* dk, float* dv, float* dlog_i,
                                        float* dlog_f, float* dC0, float* dn0, float* dm0, int64_t blocks,
                                        int64_t L, int64_t Dk, int64_t Dv, float eps, int64_t threads) {
    const Backward p{{blocks, L, Dk, Dv, eps}, q, k, v, log_i, log_f, C0, n0, m0, h, qn, den, dh, scores,
                     dq, dk, dv, dlog_i, dlog_f, dC0, dn0, dm0};
    run_blocks(p, backward_block, true, threads);
}

void xlstm_zoo_mlstm_chunk_sums_forward_f32(const float* k, const float* v, const float* a, float* C, float* n,
                                            int64_t blocks, int64_t L, int64_t Dk, int64_t Dv, int64_t threads) {
    const Sums p{{blocks, L, Dk, Dv, 0.0f}, k, v, a, nullptr, nullptr, C, n, nullptr, nullptr, nullptr};
    run_blocks(p, sums_forward_block, false, threads);
}

void xlstm_zoo_mlstm_chunk_sums_backward_f32(const float* k, const float* v, const float* a, const float* dC,
                                             const float* dn, float* dk, float* dv, float* da, int64_t blocks,
                                             int64_t L, int64_t Dk, int64_t Dv, int64_t threads) {
    const Sums p{{blocks, L, Dk, Dv, 0.0f}, k, v, a, dC, dn, nullptr, nullptr, dk, dv, da};
    run_blocks(p, sums_backward_block, false, threads);
}

}  // extern "C"
