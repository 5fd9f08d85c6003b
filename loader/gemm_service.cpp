#include "loader/gemm_service.h"

#include "kernel_hub/kernel_hub.hpp"

namespace kh {

static_assert(sizeof(kh_gemm_t) == kGemmV1_2Size, "kh_gemm_t of ABI 1.2 is 136 bytes");

int32_t read_gemm(const kh_gemm_t* in, kh_gemm_t& out, std::string& error) {
  (void)in;
  out = {};
  error = "the GEMM service is not implemented yet";
  return KH_ERR_NOT_FOUND;
}

int32_t run_gemm(const kh_gemm_t* g, void* stream, std::string& error) noexcept {
  (void)stream;
  kh_gemm_t request;
  return read_gemm(g, request, error);
}

int32_t gemm(const kh_gemm_t& g, void* stream) noexcept {
  try {
    std::string error;
    int32_t status = run_gemm(&g, stream, error);
    if (status != KH_OK) set_last_op_error("gemm: " + error);
    return status;
  } catch (...) {
    return KH_ERR_INTERNAL;
  }
}

}  // namespace kh
