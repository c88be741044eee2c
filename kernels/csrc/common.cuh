// Framework-independent helpers shared by the DiT kernels: 16-byte packets, conversions, reductions.
// Raw pointers only; no torch headers (they would make every JIT build take a minute).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

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

// 16 bytes of T: one vectorised global load or store (LDG.128 / STG.128), held as four 32-bit words.
// Words, not an array of T: for bf16 an element array is split into 16-bit values, and a packet loaded
// under a bounds check then needs PRMTs right after the load (stalling the next loads until it lands)
// plus twice the registers; fp16 escaped this only because nvcc keeps __half pairs packed. Elements
// are read and written in pairs (get2/set2): one paired conversion per word, like __half2.
template <typename T> struct alignas(16) Packet {
  static constexpr int N = 16 / sizeof(T);
  uint32_t w[4];
};

template <typename T> __device__ __forceinline__ Packet<T> load_packet(const T* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  return Packet<T>{{raw.x, raw.y, raw.z, raw.w}};
}

// Read-only data reused by many rows (modulation vectors): through the non-coherent cache.
template <typename T> __device__ __forceinline__ Packet<T> load_packet_ro(const T* p) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  return Packet<T>{{raw.x, raw.y, raw.z, raw.w}};
}

template <typename T> __device__ __forceinline__ void store_packet(T* p, const Packet<T>& v) {
  *reinterpret_cast<uint4*>(p) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
}

template <typename To, typename From> __device__ __forceinline__ To bit_cast32(From v) {
  static_assert(sizeof(To) == 4 && sizeof(From) == 4, "32-bit reinterpretation only");
  To out;
  memcpy(&out, &v, 4);
  return out;
}

// Elements 2j and 2j+1 of a packet as fp32, and their store with one round-to-nearest-even each
// (__floats2half2_rn / __floats2bfloat162_rn round like __float2half_rn / __float2bfloat16_rn).
template <typename T> struct PairIo;
template <> struct PairIo<float> {
  static __device__ __forceinline__ float2 get(const Packet<float>& p, int j) {
    return make_float2(__uint_as_float(p.w[2 * j]), __uint_as_float(p.w[2 * j + 1]));
  }
  static __device__ __forceinline__ void set(Packet<float>& p, int j, float a, float b) {
    p.w[2 * j] = __float_as_uint(a);
    p.w[2 * j + 1] = __float_as_uint(b);
  }
};
template <> struct PairIo<__half> {
  static __device__ __forceinline__ float2 get(const Packet<__half>& p, int j) {
    return __half22float2(bit_cast32<__half2>(p.w[j]));
  }
  static __device__ __forceinline__ void set(Packet<__half>& p, int j, float a, float b) {
    p.w[j] = bit_cast32<uint32_t>(__floats2half2_rn(a, b));
  }
};
template <> struct PairIo<__nv_bfloat16> {
  // bf16 -> fp32 is exact: the 16 bits become the high half of the float. Done on the 32-bit word
  // (shift / mask): __bfloat1622float2 splits the word into 16-bit halves first, and ptxas places that
  // split (PRMT) right after the load, where it waits for the data before the next loads issue.
  static __device__ __forceinline__ float2 get(const Packet<__nv_bfloat16>& p, int j) {
    return make_float2(__uint_as_float(p.w[j] << 16), __uint_as_float(p.w[j] & 0xffff0000u));
  }
  static __device__ __forceinline__ void set(Packet<__nv_bfloat16>& p, int j, float a, float b) {
    p.w[j] = bit_cast32<uint32_t>(__floats2bfloat162_rn(a, b));
  }
};

template <typename T> __device__ __forceinline__ float2 get2(const Packet<T>& p, int j) { return PairIo<T>::get(p, j); }
template <typename T> __device__ __forceinline__ void set2(Packet<T>& p, int j, float a, float b) {
  PairIo<T>::set(p, j, a, b);
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
