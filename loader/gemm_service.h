// The GEMM service (kernel_hub_abi.h, kh_gemm_t; ABI 1.2): one entry for packages
// (kh_host_v1_t.gemm), embedders (kh_gemm, kh::gemm) and the loader's own code. A request is
// read as far as its struct_size reaches (fields of a newer minor than the writer's read as 0),
// checked (read_gemm: no device needed, so every rule is testable anywhere), then run on the
// cpu (device_id < 0: gemm_cpu.h) or through cuBLASLt (loader/cublaslt.h) on a CUDA device.
#pragma once

#include <cstdint>
#include <string>

#include "kernel_hub/kernel_hub_abi.h"

namespace kh {

// struct_size of the first kh_gemm_t (ABI 1.2, through stride_d): the smallest the loader takes.
constexpr uint32_t kGemmV1_2Size = 136;

// Copies *in into `out` as far as in->h.struct_size reaches (the rest of `out` is 0), then checks
// the request: the ABI major, struct_size, flags, dtypes, sizes (and that their products fit in
// int64), leading dimensions, batch strides and null pointers. Sets batch 0 to 1.
// KH_ERR_INVALID_ARGUMENT or KH_ERR_UNSUPPORTED with `error` saying which field is wrong.
int32_t read_gemm(const kh_gemm_t* in, kh_gemm_t& out, std::string& error);

// Bytes per element and the name of a KH_DTYPE_* code ("bf16", "fp16", "fp32").
int64_t gemm_dtype_bytes(uint32_t code);
const char* gemm_dtype_name(uint32_t code);

// Reads, checks and runs one request on `stream`. Never throws: `error` receives the message.
int32_t run_gemm(const kh_gemm_t* g, void* stream, std::string& error) noexcept;

}  // namespace kh
