// C interface of the fused sLSTM forward kernel (slstm_kernel.cu). Plain CUDA runtime types only,
// so the kernel file builds with nvcc alone and the torch glue (slstm_binding.cpp) stays separate.
#pragma once

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

// Element type of wx and h (states, R and all arithmetic are fp32).
enum XlstmZooDtype { XLSTM_ZOO_F32 = 0, XLSTM_ZOO_BF16 = 1, XLSTM_ZOO_F16 = 2 };

// Largest head dimension: one thread per unit of a head, so Dh <= threads per block.
#define XLSTM_ZOO_SLSTM_MAX_HEAD_DIM 512

// Runs the whole sequence on `stream`. All pointers are device pointers to contiguous tensors:
//   wx      [B,H,T,4*Dh]  dtype, gate blocks (i, f, z, o) = W x + b
//   R       [H,Dh,4*Dh]   fp32, gates_t = wx_t + h_{t-1} @ R[head]
//   c0..h0  [B,H,Dh]      fp32 initial state (zero state: c = n = h = 0, m = -inf)
//   h_out   [B,H,T,Dh]    dtype
//   c1..h1  [B,H,Dh]      fp32 final state
//   saved   nullptr, or 4 consecutive fp32 blocks [T+1,H,B,Dh] (c, n, m, h per step, step 0 = the
//           initial state), time-major as the fused backward pass expects.
// input_exp / forget_exp: 1 = exponential gate (log g = x), 0 = sigmoid (log g = logsigmoid(x)).
// Returns the launch status (cudaSuccess, cudaErrorInvalidValue for bad sizes or dtype).
cudaError_t xlstm_zoo_slstm_forward(int dtype, const void* wx, const float* R, const float* c0, const float* n0,
                                    const float* m0, const float* h0, void* h_out, float* c1, float* n1, float* m1,
                                    float* h1, float* saved, int B, int H, int T, int Dh, int input_exp,
                                    int forget_exp, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
