// The GEMM service on the host (kh_gemm_t with device_id < 0): fp32 accumulation in blocks that
// stay in cache, inputs widened to fp32 once per block, results rounded to the result dtype
// (round to nearest even). Single-threaded, on the calling thread: it serves cpu variants and
// tests, not throughput.
#pragma once

#include <cstdint>

#include "kernel_hub/kernel_hub_abi.h"

namespace kh {

// Runs a request read_gemm accepted (loader/gemm_service.h), all of it, m and n >= 1.
void gemm_cpu(const kh_gemm_t& g);

// Conversions of the 16-bit storage formats (bits), round to nearest even; NaN stays NaN.
float bf16_bits_to_float(uint16_t bits);
uint16_t float_to_bf16_bits(float value);
float fp16_bits_to_float(uint16_t bits);
uint16_t float_to_fp16_bits(float value);

}  // namespace kh
