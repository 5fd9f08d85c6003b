// kh_prelude.cuh: the one prelude shared by every kernel package's device source and its host
// (cpu) implementation.
//
// Device sources must be header-free so that NVRTC compiles them with no -I path and no CUDA
// header (REFERENCE §5.6): the build inlines this file into each package's shipped <package>.cu
// (kernels/common/expand_includes.cmake), and host code includes it directly. It therefore only
// uses the language: no <cstdint>, no cuda_bf16.h. bf16 and fp16 are 16-bit storage types with
// bit-exact round-to-nearest-even conversions; the host and the device produce the same bits
// (NaN becomes the canonical 0x7FFF, as the device's cvt.rn does).
#ifndef KH_PRELUDE_CUH_
#define KH_PRELUDE_CUH_

#if defined(__CUDACC__)
#define KH_HD __host__ __device__ __forceinline__
#define KH_DEV __device__ __forceinline__
#else
#define KH_HD inline
#endif

typedef unsigned short kh_u16;
typedef unsigned int kh_u32;
typedef long long kh_i64;

// The smallest normal float (FLT_MIN: no <cfloat> under NVRTC).
#define KH_FLT_MIN 1.17549435e-38f

// Storage-only 16-bit float types; all arithmetic is done in fp32.
struct kh_bf16 {
  kh_u16 bits;
};
struct kh_fp16 {
  kh_u16 bits;
};

KH_HD kh_u32 kh_float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  kh_u32 u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
#endif
}

KH_HD float kh_bits_float(kh_u32 u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// bf16 is the upper half of an fp32: widening is exact.
KH_HD float kh_bf16_bits_to_float(kh_u16 h) {
  return kh_bits_float((kh_u32)h << 16);
}

// fp32 -> bf16, round to nearest even; NaN -> 0x7FFF; overflow rounds to +-inf.
KH_HD kh_u16 kh_float_to_bf16_bits(float f) {
#if defined(__CUDA_ARCH__)
  kh_u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
#else
  kh_u32 u = kh_float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (kh_u16)(u >> 16);
#endif
}

// fp16 -> fp32, exact (subnormals, inf and NaN payloads kept).
KH_HD float kh_fp16_bits_to_float(kh_u16 h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  kh_u32 sign = (kh_u32)(h & 0x8000u) << 16;
  kh_u32 exp = (h >> 10) & 0x1Fu;
  kh_u32 man = h & 0x3FFu;
  if (exp == 0x1F) return kh_bits_float(sign | 0x7F800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return kh_bits_float(sign);
    // Subnormal: normalize the mantissa; the value is man * 2^-24.
    int e = 1;
    while (!(man & 0x400u)) {
      man <<= 1;
      --e;
    }
    man &= 0x3FFu;
    return kh_bits_float(sign | ((kh_u32)(e + 112) << 23) | (man << 13));
  }
  return kh_bits_float(sign | ((exp + 112) << 23) | (man << 13));
#endif
}

// fp32 -> fp16, round to nearest even (into subnormals too); NaN -> 0x7FFF; |f| >= 65520 -> inf.
KH_HD kh_u16 kh_float_to_fp16_bits(float f) {
#if defined(__CUDA_ARCH__)
  kh_u16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
#else
  kh_u32 u = kh_float_bits(f);
  kh_u32 sign = (u >> 16) & 0x8000u;
  kh_u32 a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7FFF;
  if (a >= 0x47800000u) return (kh_u16)(sign | 0x7C00u);  // >= 65536 (and inf)
  if (a >= 0x38800000u) {                                 // normal fp16 range [2^-14, 65536)
    kh_u32 r = a - (112u << 23);                          // rebias 127 -> 15
    r += 0xFFFu + ((r >> 13) & 1u);                       // may carry up to inf: correct
    return (kh_u16)(sign | (r >> 13));
  }
  if (a < 0x33000000u) return (kh_u16)sign;  // < 2^-25 rounds to zero
  // Subnormal fp16: the result is round(value / 2^-24); value = m * 2^(e - 150).
  kh_u32 e = a >> 23;
  kh_u32 m = (a & 0x7FFFFFu) | 0x800000u;
  kh_u32 shift = 126u - e;  // 14..24
  kh_u32 q = m >> shift;
  kh_u32 rem = m & ((1u << shift) - 1u);
  kh_u32 half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // q == 0x400 is the smallest normal
  return (kh_u16)(sign | q);
#endif
}

// std::is_same without <type_traits>.
template <typename A, typename B>
struct kh_same {
  static constexpr bool value = false;
};
template <typename A>
struct kh_same<A, A> {
  static constexpr bool value = true;
};

KH_HD float kh_to_float(float v) {
  return v;
}
KH_HD float kh_to_float(kh_bf16 v) {
  return kh_bf16_bits_to_float(v.bits);
}
KH_HD float kh_to_float(kh_fp16 v) {
  return kh_fp16_bits_to_float(v.bits);
}

template <typename T>
struct kh_convert;
template <>
struct kh_convert<float> {
  static KH_HD float from_float(float f) { return f; }
};
template <>
struct kh_convert<kh_bf16> {
  static KH_HD kh_bf16 from_float(float f) {
    kh_bf16 r;
    r.bits = kh_float_to_bf16_bits(f);
    return r;
  }
};
template <>
struct kh_convert<kh_fp16> {
  static KH_HD kh_fp16 from_float(float f) {
    kh_fp16 r;
    r.bits = kh_float_to_fp16_bits(f);
    return r;
  }
};

// Rounds f to T and back: the value a T tensor would store.
template <typename T>
KH_HD float kh_round_to(float f) {
  return kh_to_float(kh_convert<T>::from_float(f));
}

#if defined(__CUDACC__)
// ---- device-only helpers: 16-byte vectors, cache-hinted loads, row reductions ----

// 16 bytes: 8 bf16/fp16 or 4 fp32. Plain struct so no vector_types.h is needed.
struct alignas(16) kh_u32x4 {
  kh_u32 x, y, z, w;
};

// Streaming load for data read once (evict first; coherent, so it may read what this kernel
// wrote earlier in the same thread).
// KH_STREAM_LOAD (a -D for tuning sweeps): 0 ld.global.cs, 1 ld.global.L1::no_allocate,
// 2 a plain ld.global. Plain is the default: on the H200 (16384 x 8192 bf16) the .cs hint made
// the forward kernels 4-8% slower: RMSNorm 140.5 vs 134.8 us, add+RMSNorm 274.3 vs 263.5,
// SiluAndMul 208.2 vs 192.4, GeluAndMul(tanh) 208.3 vs 191.6.
#ifndef KH_STREAM_LOAD
#define KH_STREAM_LOAD 2
#endif
#if KH_STREAM_LOAD == 0
#define KH_STREAM_LOAD_OP "ld.global.cs.v4.u32"
#elif KH_STREAM_LOAD == 1
#define KH_STREAM_LOAD_OP "ld.global.L1::no_allocate.v4.u32"
#else
#define KH_STREAM_LOAD_OP "ld.global.v4.u32"
#endif
KH_DEV kh_u32x4 kh_ld_stream(const void* p) {
  kh_u32x4 r;
  asm volatile(KH_STREAM_LOAD_OP " {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// Read-only load for data that stays constant during the kernel and is reused (weights).
KH_DEV kh_u32x4 kh_ld_readonly(const void* p) {
  kh_u32x4 r;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

// Plain coherent load (for data written earlier in this kernel).
KH_DEV kh_u32x4 kh_ld(const void* p) {
  return *reinterpret_cast<const kh_u32x4*>(p);
}

KH_DEV void kh_st(void* p, const kh_u32x4& v) {
  *reinterpret_cast<kh_u32x4*>(p) = v;
}

// Raw storage of VEC elements of T: one T (scalar path) or one 16-byte vector.
template <typename T, int VEC>
struct kh_raw {
  kh_u32x4 v;
};
template <typename T>
struct kh_raw<T, 1> {
  T v;
};

// Number of T in a 16-byte vector.
template <typename T>
struct kh_vec16 {
  static constexpr int n = 16 / (int)sizeof(T);
};

enum kh_load_kind { KH_LOAD_STREAM = 0, KH_LOAD_READONLY = 1, KH_LOAD_PLAIN = 2 };

template <typename T, int VEC, int KIND>
KH_DEV kh_raw<T, VEC> kh_load_raw(const T* p) {
  kh_raw<T, VEC> r;
  if constexpr (VEC == 1) {
    r.v = *p;
  } else if constexpr (KIND == KH_LOAD_STREAM) {
    r.v = kh_ld_stream(p);
  } else if constexpr (KIND == KH_LOAD_READONLY) {
    r.v = kh_ld_readonly(p);
  } else {
    r.v = kh_ld(p);
  }
  return r;
}

template <typename T, int VEC>
KH_DEV void kh_store_raw(T* p, const kh_raw<T, VEC>& r) {
  if constexpr (VEC == 1) {
    *p = r.v;
  } else {
    kh_st(p, r.v);
  }
}

KH_DEV void kh_u32x4_words(const kh_u32x4& v, kh_u32 (&w)[4]) {
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
}

// Widen VEC elements to fp32.
template <typename T, int VEC>
KH_DEV void kh_unpack(const kh_raw<T, VEC>& r, float (&f)[VEC]) {
  if constexpr (VEC == 1) {
    f[0] = kh_to_float(r.v);
  } else {
    kh_u32 w[4];
    kh_u32x4_words(r.v, w);
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) f[i] = kh_bits_float(w[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        kh_u16 lo = (kh_u16)(w[i] & 0xFFFFu), hi = (kh_u16)(w[i] >> 16);
        if constexpr (kh_same<T, kh_bf16>::value) {
          f[2 * i] = kh_bf16_bits_to_float(lo);
          f[2 * i + 1] = kh_bf16_bits_to_float(hi);
        } else {
          f[2 * i] = kh_fp16_bits_to_float(lo);
          f[2 * i + 1] = kh_fp16_bits_to_float(hi);
        }
      }
    }
  }
}

// Round VEC fp32 values to T (nearest even) and pack them.
template <typename T, int VEC>
KH_DEV kh_raw<T, VEC> kh_pack(const float (&f)[VEC]) {
  kh_raw<T, VEC> r;
  if constexpr (VEC == 1) {
    r.v = kh_convert<T>::from_float(f[0]);
  } else {
    kh_u32 w[4];
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i] = kh_float_bits(f[i]);
    } else if constexpr (kh_same<T, kh_bf16>::value) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // cvt.rn.bf16x2.f32 d, hi, lo packs two conversions in one instruction.
        kh_u32 p;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(f[2 * i + 1]), "f"(f[2 * i]));
        w[i] = p;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        kh_u32 p;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(f[2 * i + 1]), "f"(f[2 * i]));
        w[i] = p;
      }
    }
    r.v.x = w[0];
    r.v.y = w[1];
    r.v.z = w[2];
    r.v.w = w[3];
  }
  return r;
}

// Sum over the blockDim.x threads of one row (threadIdx.y picks the row inside the CTA);
// blockDim.x is a power of two. Every thread of the row gets the same bits. All threads of the
// CTA must call it (it may synchronize). `red` is __shared__ float[32].
KH_DEV float kh_row_sum(float v, float* red) {
  const int tpr = blockDim.x;
  const int lanes = tpr < 32 ? tpr : 32;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    if (off < lanes) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  if (tpr > 32) {
    const int wpr = tpr >> 5;
    const int base = threadIdx.y * wpr;
    if ((threadIdx.x & 31) == 0) red[base + (threadIdx.x >> 5)] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < wpr; ++i) s += red[base + i];
    __syncthreads();  // red is reused by the next reduction
    v = s;
  }
  return v;
}

// Two sums at once (one synchronization): `red` is __shared__ float[64].
KH_DEV void kh_row_sum2(float& a, float& b, float* red) {
  const int tpr = blockDim.x;
  const int lanes = tpr < 32 ? tpr : 32;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    if (off < lanes) {
      a += __shfl_xor_sync(0xFFFFFFFFu, a, off);
      b += __shfl_xor_sync(0xFFFFFFFFu, b, off);
    }
  if (tpr > 32) {
    const int wpr = tpr >> 5;
    const int base = threadIdx.y * wpr;
    if ((threadIdx.x & 31) == 0) {
      red[base + (threadIdx.x >> 5)] = a;
      red[32 + base + (threadIdx.x >> 5)] = b;
    }
    __syncthreads();
    float sa = 0.f, sb = 0.f;
    for (int i = 0; i < wpr; ++i) {
      sa += red[base + i];
      sb += red[32 + base + i];
    }
    __syncthreads();
    a = sa;
    b = sb;
  }
}
#endif  // __CUDACC__

#endif  // KH_PRELUDE_CUH_
