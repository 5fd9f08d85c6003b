// The bf16/fp16 conversions of kernels/common/kh_prelude.cuh (host side; the device side uses
// cvt.rn, which rounds the same way): exhaustive widening round trips, and narrowing against
// independent references (nearest-even by comparing neighbours in double; GCC's _Float16).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "kernels/common/kh_prelude.cuh"

namespace {

float f_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even to bf16 by comparing the two neighbouring bf16 values in double.
uint16_t bf16_reference(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7FFF;
  uint32_t lo = u & 0xFFFF0000u;  // toward zero
  if (lo == u) return static_cast<uint16_t>(u >> 16);
  uint32_t hi = lo + 0x10000u;  // away from zero (may become inf: correct)
  // Past the largest finite bf16, IEEE rounding treats infinity as the next value, 2^128.
  const double hi_value = (hi & 0x7FFFFFFFu) == 0x7F800000u ? std::ldexp(1.0, 128) : f_of(hi);
  double dl = std::fabs(static_cast<double>(f) - f_of(lo));
  double dh = std::fabs(std::fabs(hi_value) - std::fabs(static_cast<double>(f)));
  if (dl < dh) return static_cast<uint16_t>(lo >> 16);
  if (dh < dl) return static_cast<uint16_t>(hi >> 16);
  return static_cast<uint16_t>(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

TEST(KernelsPrelude, Bf16WidensExactlyAndRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = kh_bf16_bits_to_float(static_cast<uint16_t>(h));
    uint32_t u;
    std::memcpy(&u, &f, 4);
    ASSERT_EQ(u, h << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(kh_float_to_bf16_bits(f), h) << std::hex << h;
    }
  }
}

TEST(KernelsPrelude, Fp16WidensExactlyAndRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = kh_fp16_bits_to_float(static_cast<uint16_t>(h));
    _Float16 ref;
    uint16_t hb = static_cast<uint16_t>(h);
    std::memcpy(&ref, &hb, 2);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(static_cast<float>(ref)));
      continue;
    }
    ASSERT_EQ(f, static_cast<float>(ref)) << std::hex << h;
    ASSERT_EQ(kh_float_to_fp16_bits(f), h) << std::hex << h;
  }
}

// Every 4099th float (all exponents, many mantissas) plus random ones and the midpoints between
// neighbouring 16-bit values, where rounding decides.
TEST(KernelsPrelude, NarrowingRoundsToNearestEven) {
  std::mt19937_64 rng(std::random_device{}());
  auto check = [](uint32_t u) {
    float f = f_of(u);
    ASSERT_EQ(kh_float_to_bf16_bits(f), bf16_reference(f)) << std::hex << u;
    _Float16 h = static_cast<_Float16>(f);
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    if (std::isnan(f)) {
      ASSERT_EQ(kh_float_to_fp16_bits(f), 0x7FFF);
    } else {
      ASSERT_EQ(kh_float_to_fp16_bits(f), hb) << std::hex << u << " " << f;
    }
  };
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4099) check(static_cast<uint32_t>(u));
  for (int i = 0; i < 1000000; ++i) check(static_cast<uint32_t>(rng()));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    // bf16 midpoints (exact ties) and their neighbours.
    uint32_t mid = (h << 16) | 0x8000u;
    for (uint32_t d : {0u, 1u, 0xFFFFFFFFu}) check(mid + d);
    // fp16 midpoints: halfway between consecutive fp16 values, in float.
    _Float16 a, b;
    uint16_t ha = static_cast<uint16_t>(h), hb2 = static_cast<uint16_t>(h + 1);
    std::memcpy(&a, &ha, 2);
    std::memcpy(&b, &hb2, 2);
    float fa = static_cast<float>(a), fb = static_cast<float>(b);
    if (std::isfinite(fa) && std::isfinite(fb) && h != 0x7FFF && h != 0xFFFF) {
      float m = static_cast<float>((static_cast<double>(fa) + fb) / 2);
      uint32_t mu;
      std::memcpy(&mu, &m, 4);
      for (uint32_t d : {0u, 1u, 0xFFFFFFFFu}) check(mu + d);
    }
  }
  // Overflow and subnormal boundaries.
  for (float f : {65504.f, 65519.f, 65520.f, 65536.f, 1e30f, -65520.f, 5.96e-8f, 2.98e-8f, 2.99e-8f,
                  6.1e-5f, 3.4028235e38f, INFINITY, -INFINITY})
    check([&] {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return u;
    }());
}

}  // namespace
