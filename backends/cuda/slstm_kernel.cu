// Fused sLSTM forward: the whole time loop of the stabilised cell (DESIGN.md section 3) in one kernel.
//
// Layout: one thread block per (head, tile of BT batch rows); thread j owns unit j of the head and keeps
// that unit's c, n, m for the BT rows in registers for the whole sequence. h_{t-1} of the tile lives in
// shared memory (BT x Dh fp32), because every unit's four gates need all of it.
//
// Why R is streamed from L2 rather than held on chip: one head's R is Dh x 4*Dh fp32, 1 MiB at
// Dh = 256, more than one SM's shared memory or register file. Holding it on chip would need the
// head split over several cooperating blocks with a grid-wide barrier every step; instead each step
// reads R column-coalesced through the read-only path (L1 for small heads, L2 otherwise) and reuses
// every element for the BT batch rows of the tile. Simpler, any Dh up to 512, no cooperative launch;
// the price is R traffic per step, which the host launcher trades against parallelism through BT.
//
// Numerics follow the reference exactly: fp32 states and accumulation whatever the input dtype,
// log f + m_{t-1} kept as one value so f' = exp(0) = 1 when the forget path is the max, and the zero
// state m = -inf handled by the maths alone (first step: m = log i, i' = 1, f' = 0).

#include "slstm_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stddef.h>

namespace {

template <typename T>
struct Convert;

template <>
struct Convert<float> {
  static __device__ __forceinline__ float load(float x) { return x; }
  static __device__ __forceinline__ float store(float x) { return x; }
};

template <>
struct Convert<__nv_bfloat16> {
  static __device__ __forceinline__ float load(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }
};

template <>
struct Convert<__half> {
  static __device__ __forceinline__ float load(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half store(float x) { return __float2half_rn(x); }
};

// log of the gate activation. Sigmoid: logsigmoid(x) = min(x, 0) - log1p(exp(-|x|)), exact for any x
// (never exp of a large positive number). Exponential: log exp(x) = x.
__device__ __forceinline__ float log_gate(float x, int exponential) {
  if (exponential) return x;
  return fminf(x, 0.0f) - log1pf(expf(-fabsf(x)));
}

template <typename T, int BT>
__global__ void __launch_bounds__(XLSTM_ZOO_SLSTM_MAX_HEAD_DIM)
slstm_forward_kernel(const T* __restrict__ wx, const float* __restrict__ R, const float* __restrict__ c0,
                     const float* __restrict__ n0, const float* __restrict__ m0, const float* __restrict__ h0,
                     T* __restrict__ h_out, float* __restrict__ c1, float* __restrict__ n1, float* __restrict__ m1,
                     float* __restrict__ h1, float* __restrict__ saved, int B, int H, int T_len, int Dh,
                     int input_exp, int forget_exp) {
  extern __shared__ float h_prev[];  // [BT][Dh]: h_{t-1} of this tile, fp32
  const int head = blockIdx.x;
  const int b0 = blockIdx.y * BT;
  const int j = threadIdx.x;
  const bool unit = j < Dh;  // threads past Dh only join the barriers
  const size_t G = 4 * (size_t)Dh;
  // Saved states: time-major [T+1, H, B, Dh], four consecutive blocks (c, n, m, h).
  const size_t saved_block = ((size_t)T_len + 1) * H * B * Dh;

  float c[BT], n[BT], m[BT];
#pragma unroll
  for (int b = 0; b < BT; ++b) {
    const int row = b0 + b;
    float h = 0.0f;
    c[b] = 0.0f, n[b] = 1.0f, m[b] = 0.0f;  // padding rows: finite values, never written out
    if (unit && row < B) {
      const size_t s = ((size_t)row * H + head) * Dh + j;
      c[b] = c0[s], n[b] = n0[s], m[b] = m0[s], h = h0[s];
      if (saved) {
        const size_t at = ((size_t)head * B + row) * Dh + j;
        saved[at] = c[b], saved[saved_block + at] = n[b], saved[2 * saved_block + at] = m[b];
        saved[3 * saved_block + at] = h;
      }
    }
    if (unit) h_prev[b * Dh + j] = h;
  }
  __syncthreads();

  const float* Rh = R + (size_t)head * Dh * G;
  for (int t = 0; t < T_len; ++t) {
    // This step's W x first: its global-memory latency overlaps the recurrent matmul below.
    float w[4][BT];
#pragma unroll
    for (int b = 0; b < BT; ++b) {
      const int row = b0 + b;
      const bool live = unit && row < B;
      const size_t base = (((size_t)row * H + head) * T_len + t) * G + j;
#pragma unroll
      for (int g = 0; g < 4; ++g) w[g][b] = live ? Convert<T>::load(wx[base + g * (size_t)Dh]) : 0.0f;
    }

    // gates = h_{t-1} @ R[head]: column j of each gate block; consecutive threads read consecutive
    // columns of one row of R (coalesced), and all threads read the same h (shared-memory broadcast).
    float acc[4][BT];
#pragma unroll
    for (int b = 0; b < BT; ++b) acc[0][b] = acc[1][b] = acc[2][b] = acc[3][b] = 0.0f;
    if (unit) {
#pragma unroll 4
      for (int k = 0; k < Dh; ++k) {
        const float* r = Rh + (size_t)k * G + j;
        const float ri = __ldg(r), rf = __ldg(r + Dh), rz = __ldg(r + 2 * Dh), ro = __ldg(r + 3 * Dh);
#pragma unroll
        for (int b = 0; b < BT; ++b) {
          const float hk = h_prev[b * Dh + k];
          acc[0][b] = fmaf(hk, ri, acc[0][b]);
          acc[1][b] = fmaf(hk, rf, acc[1][b]);
          acc[2][b] = fmaf(hk, rz, acc[2][b]);
          acc[3][b] = fmaf(hk, ro, acc[3][b]);
        }
      }
    }
    __syncthreads();  // every thread has read h_{t-1} before any overwrites it with h_t

    if (unit) {
#pragma unroll
      for (int b = 0; b < BT; ++b) {
        const int row = b0 + b;
        if (row >= B) continue;
        const float gi = w[0][b] + acc[0][b], gf = w[1][b] + acc[1][b];
        const float gz = w[2][b] + acc[2][b], go = w[3][b] + acc[3][b];
        const float log_i = log_gate(gi, input_exp);
        const float log_fm = log_gate(gf, forget_exp) + m[b];  // log f + m_{t-1} as one value
        const float m_new = fmaxf(log_fm, log_i);
        const float i_s = expf(log_i - m_new);
        const float f_s = expf(log_fm - m_new);
        c[b] = f_s * c[b] + i_s * tanhf(gz);
        n[b] = f_s * n[b] + i_s;
        m[b] = m_new;
        const float o = 1.0f / (1.0f + expf(-go));
        const float h = o * (c[b] / n[b]);
        h_prev[b * Dh + j] = h;
        h_out[(((size_t)row * H + head) * T_len + t) * Dh + j] = Convert<T>::store(h);
        if (saved) {
          const size_t at = (((size_t)(t + 1) * H + head) * B + row) * Dh + j;
          saved[at] = c[b], saved[saved_block + at] = n[b], saved[2 * saved_block + at] = m[b];
          saved[3 * saved_block + at] = h;
        }
      }
    }
    __syncthreads();  // h_t complete before the next step reads it
  }

  if (unit) {
#pragma unroll
    for (int b = 0; b < BT; ++b) {
      const int row = b0 + b;
      if (row >= B) continue;
      const size_t s = ((size_t)row * H + head) * Dh + j;
      c1[s] = c[b], n1[s] = n[b], m1[s] = m[b], h1[s] = h_prev[b * Dh + j];
    }
  }
}

template <typename T, int BT>
cudaError_t launch(const void* wx, const float* R, const float* c0, const float* n0, const float* m0,
                   const float* h0, void* h_out, float* c1, float* n1, float* m1, float* h1, float* saved, int B,
                   int H, int T_len, int Dh, int input_exp, int forget_exp, cudaStream_t stream) {
  const dim3 grid(H, (B + BT - 1) / BT);
  const dim3 block((Dh + 31) / 32 * 32);
  const size_t shared = sizeof(float) * BT * Dh;
  slstm_forward_kernel<T, BT><<<grid, block, shared, stream>>>(
      static_cast<const T*>(wx), R, c0, n0, m0, h0, static_cast<T*>(h_out), c1, n1, m1, h1, saved, B, H, T_len,
      Dh, input_exp, forget_exp);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_tiles(int tile, const void* wx, const float* R, const float* c0, const float* n0,
                         const float* m0, const float* h0, void* h_out, float* c1, float* n1, float* m1, float* h1,
                         float* saved, int B, int H, int T_len, int Dh, int ie, int fe, cudaStream_t s) {
  switch (tile) {
    case 8: return launch<T, 8>(wx, R, c0, n0, m0, h0, h_out, c1, n1, m1, h1, saved, B, H, T_len, Dh, ie, fe, s);
    case 4: return launch<T, 4>(wx, R, c0, n0, m0, h0, h_out, c1, n1, m1, h1, saved, B, H, T_len, Dh, ie, fe, s);
    case 2: return launch<T, 2>(wx, R, c0, n0, m0, h0, h_out, c1, n1, m1, h1, saved, B, H, T_len, Dh, ie, fe, s);
    default: return launch<T, 1>(wx, R, c0, n0, m0, h0, h_out, c1, n1, m1, h1, saved, B, H, T_len, Dh, ie, fe, s);
  }
}

}  // namespace

extern "C" cudaError_t xlstm_zoo_slstm_forward(int dtype, const void* wx, const float* R, const float* c0,
                                               const float* n0, const float* m0, const float* h0, void* h_out,
                                               float* c1, float* n1, float* m1, float* h1, float* saved, int B,
                                               int H, int T, int Dh, int input_exp, int forget_exp,
                                               cudaStream_t stream) {
  if (B < 1 || H < 1 || T < 0 || Dh < 1 || Dh > XLSTM_ZOO_SLSTM_MAX_HEAD_DIM) return cudaErrorInvalidValue;
  // Batch tile: large tiles reuse each R element for more rows (less L2 traffic), small ones give more
  // blocks. Halve the tile until the grid covers every SM once, so small batches still fill the GPU.
  int device = 0, sms = 1;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  int tile = 8;
  while (tile > 1 && (long long)H * ((B + tile - 1) / tile) < sms) tile /= 2;
  if ((B + tile - 1) / tile > 65535) return cudaErrorInvalidValue;  // gridDim.y limit: batch above 524280
  switch (dtype) {
    case XLSTM_ZOO_F32:
      return launch_tiles<float>(tile, wx, R, c0, n0, m0, h0, h_out, c1, n1, m1, h1, saved, B, H, T, Dh,
                                 input_exp, forget_exp, stream);
    case XLSTM_ZOO_BF16:
      return launch_tiles<__nv_bfloat16>(tile, wx, R, c0, n0, m0, h0, h_out, c1, n1, m1, h1, saved, B, H, T, Dh,
                                         input_exp, forget_exp, stream);
    case XLSTM_ZOO_F16:
      return launch_tiles<__half>(tile, wx, R, c0, n0, m0, h0, h_out, c1, n1, m1, h1, saved, B, H, T, Dh,
                                  input_exp, forget_exp, stream);
    default:
      return cudaErrorInvalidValue;
  }
}
