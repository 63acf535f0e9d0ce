// Torch glue for the sLSTM kernel: tensor checks, output allocation, device and stream, pybind.
// Kept apart from slstm_kernel.cu so the kernel builds with nvcc alone and this file with the host compiler.

#include <torch/extension.h>

// Only the CUDA runtime, no ATen/c10 CUDA headers: those need a CUDA build of torch (generated
// c10/cuda/impl/cuda_cmake_macros.h) and cuBLAS/cuSPARSE headers, so this file would not even compile
// on a CPU-only torch. The caller passes the current stream; the device is set here.
#include <cuda_runtime.h>

#include <limits>
#include <vector>

#include "slstm_kernel.h"

namespace {

// Makes wx's device current for the launch and restores the previous one.
struct DeviceGuard {
  int previous = -1;
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    const cudaError_t err = cudaSetDevice(device);
    TORCH_CHECK(err == cudaSuccess, "xlstm_zoo sLSTM CUDA: cannot select device ", device, ": ",
                cudaGetErrorString(err));
  }
  ~DeviceGuard() {
    if (previous >= 0) cudaSetDevice(previous);
  }
};

int dtype_code(const at::Tensor& wx) {
  switch (wx.scalar_type()) {
    case at::kFloat: return XLSTM_ZOO_F32;
    case at::kBFloat16: return XLSTM_ZOO_BF16;
    case at::kHalf: return XLSTM_ZOO_F16;
    default: TORCH_CHECK(false, "xlstm_zoo sLSTM CUDA: wx must be float32, bfloat16 or float16; got ", wx.scalar_type());
  }
  return -1;
}

void check_state(const at::Tensor& s, const char* name, const at::Tensor& wx, int64_t B, int64_t H, int64_t Dh) {
  TORCH_CHECK(s.device() == wx.device(), "xlstm_zoo sLSTM CUDA: state ", name, " is on ", s.device(), ", wx on ",
              wx.device());
  TORCH_CHECK(s.scalar_type() == at::kFloat, "xlstm_zoo sLSTM CUDA: state ", name, " must be float32; got ",
              s.scalar_type());
  TORCH_CHECK(s.is_contiguous(), "xlstm_zoo sLSTM CUDA: state ", name, " must be contiguous");
  TORCH_CHECK(s.dim() == 3 && s.size(0) == B && s.size(1) == H && s.size(2) == Dh, "xlstm_zoo sLSTM CUDA: state ",
              name, " must be [B,H,Dh] = [", B, ", ", H, ", ", Dh, "]; got ", s.sizes());
}

// `stream`: the cudaStream_t of wx's device as an integer (torch.cuda.current_stream(dev).cuda_stream).
// Returns [h, c, n, m, h_last] and, when save_states, a sixth tensor [4, T+1, H, B, Dh] (c, n, m, h
// per step, time-major) for the backward pass.
std::vector<at::Tensor> forward(const at::Tensor& wx, const at::Tensor& R, const at::Tensor& c0, const at::Tensor& n0,
                                const at::Tensor& m0, const at::Tensor& h0, bool input_exp, bool forget_exp,
                                bool save_states, int64_t stream) {
  TORCH_CHECK(wx.is_cuda(), "xlstm_zoo sLSTM CUDA: wx must be a CUDA tensor; got ", wx.device());
  TORCH_CHECK(wx.dim() == 4 && wx.size(3) % 4 == 0,
              "xlstm_zoo sLSTM CUDA: wx must be [B,H,T,4*Dh] with gate blocks (i, f, z, o); got ", wx.sizes());
  TORCH_CHECK(wx.is_contiguous(), "xlstm_zoo sLSTM CUDA: wx must be contiguous");
  const int code = dtype_code(wx);
  const int64_t B = wx.size(0), H = wx.size(1), T = wx.size(2), Dh = wx.size(3) / 4;
  TORCH_CHECK(Dh >= 1 && Dh <= XLSTM_ZOO_SLSTM_MAX_HEAD_DIM, "xlstm_zoo sLSTM CUDA: head dim must be in [1, ",
              XLSTM_ZOO_SLSTM_MAX_HEAD_DIM, "]; got ", Dh);
  TORCH_CHECK(B >= 1 && H >= 1, "xlstm_zoo sLSTM CUDA: empty batch or head dim: wx ", wx.sizes());
  TORCH_CHECK(B <= std::numeric_limits<int>::max() && H <= std::numeric_limits<int>::max() &&
                  T <= std::numeric_limits<int>::max() - 1,
              "xlstm_zoo sLSTM CUDA: sizes must fit in int32; wx ", wx.sizes());
  TORCH_CHECK(R.device() == wx.device() && R.scalar_type() == at::kFloat && R.is_contiguous(),
              "xlstm_zoo sLSTM CUDA: R must be a contiguous float32 tensor on ", wx.device(), "; got ",
              R.scalar_type(), " on ", R.device());
  TORCH_CHECK(R.dim() == 3 && R.size(0) == H && R.size(1) == Dh && R.size(2) == 4 * Dh,
              "xlstm_zoo sLSTM CUDA: R must be [H,Dh,4*Dh] = [", H, ", ", Dh, ", ", 4 * Dh, "]; got ", R.sizes());
  check_state(c0, "c", wx, B, H, Dh);
  check_state(n0, "n", wx, B, H, Dh);
  check_state(m0, "m", wx, B, H, Dh);
  check_state(h0, "h", wx, B, H, Dh);

  const DeviceGuard guard(wx.get_device());
  // NaN-filled: an element the kernel fails to write shows up instead of passing as stale memory.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  at::Tensor h = at::full({B, H, T, Dh}, nan, wx.options());
  const auto f32 = wx.options().dtype(at::kFloat);
  at::Tensor c1 = at::full({B, H, Dh}, nan, f32), n1 = at::full({B, H, Dh}, nan, f32);
  at::Tensor m1 = at::full({B, H, Dh}, nan, f32), h1 = at::full({B, H, Dh}, nan, f32);
  at::Tensor saved;
  if (save_states) saved = at::full({4, T + 1, H, B, Dh}, nan, f32);

  const cudaError_t err = xlstm_zoo_slstm_forward(
      code, wx.data_ptr(), R.data_ptr<float>(), c0.data_ptr<float>(), n0.data_ptr<float>(), m0.data_ptr<float>(),
      h0.data_ptr<float>(), h.data_ptr(), c1.data_ptr<float>(), n1.data_ptr<float>(), m1.data_ptr<float>(),
      h1.data_ptr<float>(), save_states ? saved.data_ptr<float>() : nullptr, static_cast<int>(B),
      static_cast<int>(H), static_cast<int>(T), static_cast<int>(Dh), input_exp ? 1 : 0, forget_exp ? 1 : 0,
      reinterpret_cast<cudaStream_t>(stream));
  TORCH_CHECK(err == cudaSuccess, "xlstm_zoo sLSTM CUDA: kernel launch failed: ", cudaGetErrorString(err),
              " (B=", B, ", H=", H, ", T=", T, ", Dh=", Dh, "; batch is limited to 524280 rows)");

  std::vector<at::Tensor> out{h, c1, n1, m1, h1};
  if (save_states) out.push_back(saved);
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward,
        "sLSTM forward over a sequence: (wx, R, c0, n0, m0, h0, input_exp, forget_exp, save_states, stream) -> "
        "[h, c, n, m, h_last(, saved [4,T+1,H,B,Dh])]");
  m.attr("max_head_dim") = XLSTM_ZOO_SLSTM_MAX_HEAD_DIM;
}
