// LayerNorm (no affine) fused with adaLN modulation, alone and after a gated residual:
//   out   = norm(x) * (1 + scale[b]) + shift[b]                      (layernorm_modulate)
//   x_new = x + gate[b] * y;  out = norm(x_new) * (1 + scale[b]) + shift[b]   (gated_residual_...)
// x, y, out, x_new: [B, N, H] contiguous; scale, shift, gate: rows of length H with a batch stride.
// Statistics in fp32, two-pass (mean, then squared deviations) over a row kept in registers; the fused
// op normalises the fp32 sum x + gate * y (x_new is rounded only for storage).
//
// Fast path: one warp per row, the row held as K 16-byte packets per lane (H up to 16*32 packets),
// converted in pairs (see Packet in common.cuh for why bf16 needs that).
// Fallback: one block per row, scalar loads, re-reading the row; for unaligned data or very wide rows.
#include "common.cuh"
#include "ditgate_config.h"

namespace ditgate {

constexpr int kWarpsPerBlock = 4;
constexpr int kFallbackThreads = 256;

struct AdalnArgs {
  const void* x;
  const void* y;      // residual branch (fused op only)
  const void* gate;   // fused op only
  const void* scale;
  const void* shift;
  void* x_out;        // fused op only: x + gate * y
  void* out;
  int64_t gate_stride, scale_stride, shift_stride;
  int64_t rows, tokens, hidden;
  float eps;
  int64_t rows_per_warp;  // set by the launcher
};

// Row values for the statistics, as fp32: x itself, or x + gate * y before it is rounded for storage
// (the norm sees the exact sum, like the float64 reference and torch.compile's fused kernel).
template <typename T, int K, bool kResidual> struct RowBuffer;
// Elements are addressed in pairs (2j, 2j+1), matching the paired conversions of common.cuh.
template <typename T, int K> struct RowBuffer<T, K, false> {
  Packet<T> raw[K];
  __device__ __forceinline__ float2 at2(int k, int j) const { return get2(raw[k], j); }
};
template <typename T, int K> struct RowBuffer<T, K, true> {
  float2 val[K][Packet<T>::N / 2];
  __device__ __forceinline__ float2 at2(int k, int j) const { return val[k][j]; }
};

template <typename T, int K, bool kResidual> __device__ __forceinline__ void adaln_warp_body(const AdalnArgs& a) {
  using P = Packet<T>;
  constexpr int N = P::N;
  const int lane = threadIdx.x % kWarp;
  const int64_t warp_id = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  const int64_t first = warp_id * a.rows_per_warp;
  const int64_t last = first + a.rows_per_warp < a.rows ? first + a.rows_per_warp : a.rows;
  const int packets = static_cast<int>(a.hidden / N);
  const float inv_h = 1.f / static_cast<float>(a.hidden);

  // A warp walks consecutive rows, which mostly share one batch index: the modulation rows (gate, scale,
  // shift) stay in registers until the batch changes, and their loads overlap the loads of x.
  P gs[K], ss[K], hs[K];
  int64_t cached_b = -1;
  for (int64_t row = first; row < last; ++row) {
    const int64_t b = row / a.tokens;
    const T* x = static_cast<const T*>(a.x) + row * a.hidden;
    RowBuffer<T, K, kResidual> buf;
    P xs[K], ys[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int p = lane + k * kWarp;
      if (p < packets) {
        if constexpr (kResidual) {
          xs[k] = load_packet(x + p * N);
          ys[k] = load_packet(static_cast<const T*>(a.y) + row * a.hidden + p * N);
        } else {
          buf.raw[k] = load_packet(x + p * N);
        }
      }
    }
    if (b != cached_b) {
      const T* g = static_cast<const T*>(a.gate) + b * a.gate_stride;
      const T* sc = static_cast<const T*>(a.scale) + b * a.scale_stride;
      const T* sh = static_cast<const T*>(a.shift) + b * a.shift_stride;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int p = lane + k * kWarp;
        if (p < packets) {
          if constexpr (kResidual) gs[k] = load_packet_ro(g + p * N);
          ss[k] = load_packet_ro(sc + p * N);
          hs[k] = load_packet_ro(sh + p * N);
        }
      }
      cached_b = b;
    }
    float sum = 0.f;
    if constexpr (kResidual) {
      T* xo = static_cast<T*>(a.x_out) + row * a.hidden;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int p = lane + k * kWarp;
        if (p < packets) {
          P o;
#pragma unroll
          for (int j = 0; j < N / 2; ++j) {
            const float2 xv = get2(xs[k], j), gv = get2(gs[k], j), yv = get2(ys[k], j);
            const float2 r = make_float2(xv.x + gv.x * yv.x, xv.y + gv.y * yv.y);
            buf.val[k][j] = r;
            set2(o, j, r.x, r.y);
            sum += r.x;
            sum += r.y;
          }
          store_packet(xo + p * N, o);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int p = lane + k * kWarp;
        if (p < packets) {
#pragma unroll
          for (int j = 0; j < N / 2; ++j) {
            const float2 v = buf.at2(k, j);
            sum += v.x;
            sum += v.y;
          }
        }
      }
    }
    const float mean = warp_sum(sum) * inv_h;
    float sq = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int p = lane + k * kWarp;
      if (p < packets) {
#pragma unroll
        for (int j = 0; j < N / 2; ++j) {
          const float2 v = buf.at2(k, j);
          const float d0 = v.x - mean, d1 = v.y - mean;
          sq += d0 * d0;
          sq += d1 * d1;
        }
      }
    }
    const float rstd = rsqrtf(warp_sum(sq) * inv_h + a.eps);
    T* out = static_cast<T*>(a.out) + row * a.hidden;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int p = lane + k * kWarp;
      if (p < packets) {
        P o;
#pragma unroll
        for (int j = 0; j < N / 2; ++j) {
          const float2 v = buf.at2(k, j), sc = get2(ss[k], j), sh = get2(hs[k], j);
          const float m0 = rstd * (1.f + sc.x), m1 = rstd * (1.f + sc.y);
          set2(o, j, (v.x - mean) * m0 + sh.x, (v.y - mean) * m1 + sh.y);
        }
        store_packet(out + p * N, o);
      }
    }
  }
}

template <typename T, int K, bool kResidual>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) adaln_warp_kernel(AdalnArgs a) {
  adaln_warp_body<T, K, kResidual>(a);
}

// The fused op at K <= 5 (H = 1152 in 16-bit types) fits 168 registers without spills (ptxas -v, sm_90):
// 3 blocks per multiprocessor instead of 2 at its unconstrained ~183. A separate entry point because an
// explicit minimum of 1 block also changes ptxas' choices (more registers) for the other instantiations.
constexpr int kFusedMaxKFor3Blocks = 5;
template <typename T, int K>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp, 3) adaln_warp_kernel_3blocks(AdalnArgs a) {
  adaln_warp_body<T, K, true>(a);
}

template <typename T, bool kResidual>
__global__ void __launch_bounds__(kFallbackThreads) adaln_block_kernel(AdalnArgs a) {
  __shared__ float shared[kWarp];
  const int64_t row = blockIdx.x;
  const int64_t b = row / a.tokens;
  const T* x = static_cast<const T*>(a.x) + row * a.hidden;
  const T* y = kResidual ? static_cast<const T*>(a.y) + row * a.hidden : nullptr;
  const T* g = kResidual ? static_cast<const T*>(a.gate) + b * a.gate_stride : nullptr;
  // x, or x + gate * y in fp32 (recomputed on each pass; the row stays in L1/L2)
  auto value = [&](int64_t h) -> float {
    if constexpr (kResidual) return to_float(x[h]) + to_float(g[h]) * to_float(y[h]);
    return to_float(x[h]);
  };
  float sum = 0.f;
  for (int64_t h = threadIdx.x; h < a.hidden; h += blockDim.x) {
    const float v = value(h);
    if constexpr (kResidual) static_cast<T*>(a.x_out)[row * a.hidden + h] = from_float<T>(v);
    sum += v;
  }
  const float inv_h = 1.f / static_cast<float>(a.hidden);
  const float mean = block_sum(sum, shared) * inv_h;
  float sq = 0.f;
  for (int64_t h = threadIdx.x; h < a.hidden; h += blockDim.x) {
    const float d = value(h) - mean;
    sq += d * d;
  }
  const float rstd = rsqrtf(block_sum(sq, shared) * inv_h + a.eps);
  const T* sc = static_cast<const T*>(a.scale) + b * a.scale_stride;
  const T* sh = static_cast<const T*>(a.shift) + b * a.shift_stride;
  T* out = static_cast<T*>(a.out) + row * a.hidden;
  for (int64_t h = threadIdx.x; h < a.hidden; h += blockDim.x) {
    out[h] = from_float<T>((value(h) - mean) * rstd * (1.f + to_float(sc[h])) + to_float(sh[h]));
  }
}

// Multiprocessors of the current device (cached per device): sizes the rows each warp walks.
inline int sm_count() {
  static int cache[64] = {0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 132;
  if (cache[device] == 0) {
    int sms = 0;
    cache[device] = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && sms > 0 ? sms : 132;
  }
  return cache[device];
}

template <typename T, int K, bool kResidual>
cudaError_t launch_warp(AdalnArgs a, cudaStream_t stream) {
  // enough warps for ~32 per multiprocessor, then up to 16 consecutive rows per warp
  const int64_t target_warps = static_cast<int64_t>(sm_count()) * 32;
  int64_t per_warp = a.rows / target_warps;
  a.rows_per_warp = per_warp < 1 ? 1 : (per_warp > 16 ? 16 : per_warp);
  const int64_t warps = (a.rows + a.rows_per_warp - 1) / a.rows_per_warp;
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if constexpr (kResidual && K <= kFusedMaxKFor3Blocks) {
    adaln_warp_kernel_3blocks<T, K><<<static_cast<unsigned>(blocks), kWarpsPerBlock * kWarp, 0, stream>>>(a);
  } else {
    adaln_warp_kernel<T, K, kResidual><<<static_cast<unsigned>(blocks), kWarpsPerBlock * kWarp, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <typename T, bool kResidual>
cudaError_t launch_adaln(const AdalnArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  if (a.hidden <= 0 || a.tokens <= 0 || a.rows > 0x7fffffffLL * kWarpsPerBlock) return cudaErrorInvalidValue;
  constexpr int N = Packet<T>::N;
  bool vec = a.hidden % N == 0 && aligned16(a.x) && aligned16(a.out) && aligned16(a.scale) && aligned16(a.shift) &&
             a.scale_stride % N == 0 && a.shift_stride % N == 0;
  if (kResidual)
    vec = vec && aligned16(a.y) && aligned16(a.gate) && aligned16(a.x_out) && a.gate_stride % N == 0;
  const int64_t per_lane = (a.hidden / N + kWarp - 1) / kWarp;
  if (vec) {
    switch (per_lane) {
      case 1: return launch_warp<T, 1, kResidual>(a, stream);
      case 2: return launch_warp<T, 2, kResidual>(a, stream);
      case 3: return launch_warp<T, 3, kResidual>(a, stream);
      case 4: return launch_warp<T, 4, kResidual>(a, stream);
      case 5: return launch_warp<T, 5, kResidual>(a, stream);
      case 6: return launch_warp<T, 6, kResidual>(a, stream);
      case 7: case 8: return launch_warp<T, 8, kResidual>(a, stream);
      case 9: case 10: return launch_warp<T, 10, kResidual>(a, stream);
      case 11: case 12: return launch_warp<T, 12, kResidual>(a, stream);
      case 13: case 14: case 15: case 16: return launch_warp<T, 16, kResidual>(a, stream);
      default: break;  // wider rows: the block kernel
    }
  }
  if (a.rows > 0x7fffffffLL) return cudaErrorInvalidValue;
  adaln_block_kernel<T, kResidual><<<static_cast<unsigned>(a.rows), kFallbackThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ditgate

using ditgate_t = DITGATE_SCALAR_T;

DITGATE_API int ditgate_layernorm_modulate(const void* x, const void* scale, int64_t scale_stride, const void* shift,
                                           int64_t shift_stride, void* out, int64_t batch, int64_t tokens,
                                           int64_t hidden, float eps, void* stream) {
  ditgate::AdalnArgs a{x, nullptr, nullptr, scale, shift, nullptr, out, 0, scale_stride, shift_stride,
                       batch * tokens, tokens, hidden, eps, 1};
  return static_cast<int>(ditgate::launch_adaln<ditgate_t, false>(a, static_cast<cudaStream_t>(stream)));
}

DITGATE_API int ditgate_gated_residual_layernorm_modulate(const void* x, const void* gate, int64_t gate_stride,
                                                          const void* y, const void* scale, int64_t scale_stride,
                                                          const void* shift, int64_t shift_stride, void* x_out,
                                                          void* out, int64_t batch, int64_t tokens, int64_t hidden,
                                                          float eps, void* stream) {
  ditgate::AdalnArgs a{x, y, gate, scale, shift, x_out, out, gate_stride, scale_stride, shift_stride,
                       batch * tokens, tokens, hidden, eps, 1};
  return static_cast<int>(ditgate::launch_adaln<ditgate_t, true>(a, static_cast<cudaStream_t>(stream)));
}
