// Gated residual of a DiT block: out = x + gate[b] * y, x/y/out [B, N, H] contiguous, gate rows of H
// with a batch stride. fp32 arithmetic, one rounding. Memory-bound: 16-byte packets, U packets per
// thread in flight (all loads issued before any use), converted in pairs; a scalar kernel takes
// unaligned data.
#include "common.cuh"
#include "ditgate_config.h"

namespace ditgate {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

template <typename T, typename I>
__global__ void __launch_bounds__(kThreads) gated_residual_vec_kernel(const T* __restrict__ x, const T* __restrict__ gate,
                                                                      int64_t gate_stride, const T* __restrict__ y,
                                                                      T* __restrict__ out, I total, I per_row, I tokens) {
  using P = Packet<T>;
  constexpr int N = P::N;
  const I base = static_cast<I>(blockIdx.x) * (kThreads * kUnroll) + threadIdx.x;
  P xs[kUnroll], ys[kUnroll], gs[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const I idx = base + static_cast<I>(u) * kThreads;
    if (idx < total) {
      const I row = idx / per_row;
      const I col = idx - row * per_row;
      const I b = row / tokens;
      xs[u] = load_packet(x + static_cast<int64_t>(idx) * N);
      ys[u] = load_packet(y + static_cast<int64_t>(idx) * N);
      gs[u] = load_packet_ro(gate + static_cast<int64_t>(b) * gate_stride + static_cast<int64_t>(col) * N);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const I idx = base + static_cast<I>(u) * kThreads;
    if (idx < total) {
      P o;
#pragma unroll
      for (int j = 0; j < N / 2; ++j) {
        const float2 xv = get2(xs[u], j), gv = get2(gs[u], j), yv = get2(ys[u], j);
        set2(o, j, xv.x + gv.x * yv.x, xv.y + gv.y * yv.y);
      }
      store_packet(out + static_cast<int64_t>(idx) * N, o);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) gated_residual_scalar_kernel(const T* x, const T* gate, int64_t gate_stride,
                                                                         const T* y, T* out, int64_t total,
                                                                         int64_t hidden, int64_t tokens) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t row = i / hidden, col = i - row * hidden, b = row / tokens;
    out[i] = from_float<T>(to_float(x[i]) + to_float(gate[b * gate_stride + col]) * to_float(y[i]));
  }
}

template <typename T>
cudaError_t launch_gated_residual(const T* x, const T* gate, int64_t gate_stride, const T* y, T* out, int64_t batch,
                                  int64_t tokens, int64_t hidden, cudaStream_t stream) {
  const int64_t total = batch * tokens * hidden;
  if (total == 0) return cudaSuccess;
  if (hidden <= 0 || tokens <= 0) return cudaErrorInvalidValue;
  constexpr int N = Packet<T>::N;
  const bool vec = hidden % N == 0 && gate_stride % N == 0 && aligned16(x) && aligned16(y) && aligned16(gate) &&
                   aligned16(out);
  if (vec) {
    const int64_t packets = total / N, per_row = hidden / N;
    const int64_t blocks = (packets + kThreads * kUnroll - 1) / (kThreads * kUnroll);
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    if (packets + kThreads * kUnroll < 0x7fffffffLL) {
      gated_residual_vec_kernel<T, uint32_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          x, gate, gate_stride, y, out, static_cast<uint32_t>(packets), static_cast<uint32_t>(per_row),
          static_cast<uint32_t>(tokens));
    } else {
      gated_residual_vec_kernel<T, int64_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          x, gate, gate_stride, y, out, packets, per_row, tokens);
    }
    return cudaGetLastError();
  }
  int64_t blocks = (total + kThreads - 1) / kThreads;
  if (blocks > 65536) blocks = 65536;
  gated_residual_scalar_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, gate, gate_stride, y, out,
                                                                                          total, hidden, tokens);
  return cudaGetLastError();
}

}  // namespace ditgate

using ditgate_t = DITGATE_SCALAR_T;

DITGATE_API int ditgate_gated_residual(const void* x, const void* gate, int64_t gate_stride, const void* y, void* out,
                                       int64_t batch, int64_t tokens, int64_t hidden, void* stream) {
  return static_cast<int>(ditgate::launch_gated_residual<ditgate_t>(
      static_cast<const ditgate_t*>(x), static_cast<const ditgate_t*>(gate), gate_stride,
      static_cast<const ditgate_t*>(y), static_cast<ditgate_t*>(out), batch, tokens, hidden,
      static_cast<cudaStream_t>(stream)));
}
