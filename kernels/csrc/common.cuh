// Framework-independent helpers shared by the DiT kernels: 16-byte packets, conversions, reductions.
// Raw pointers only; no torch headers (they would make every JIT build take a minute).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define DITGATE_API extern "C" __attribute__((visibility("default")))

namespace ditgate {

constexpr int kWarp = 32;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// 16 bytes of T: one vectorised global load or store (LDG.128 / STG.128).
template <typename T> struct alignas(16) Packet {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
};

template <typename T> __device__ __forceinline__ Packet<T> load_packet(const T* p) {
  uint4 raw = *reinterpret_cast<const uint4*>(p);
  return *reinterpret_cast<Packet<T>*>(&raw);
}

// Read-only data reused by many rows (modulation vectors): through the non-coherent cache.
template <typename T> __device__ __forceinline__ Packet<T> load_packet_ro(const T* p) {
  uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  return *reinterpret_cast<Packet<T>*>(&raw);
}

template <typename T> __device__ __forceinline__ void store_packet(T* p, const Packet<T>& v) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&v);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block; every thread gets the result. `shared` holds at least 32 floats.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.f;
  return warp_sum(v);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace ditgate
