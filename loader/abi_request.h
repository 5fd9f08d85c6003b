// Reading a request struct a package or an embedder passes to a loader service (kh_gemm_t,
// kh_tensor_map_t): the same ABI major, at least the size the struct had in the minor that
// introduced it, copied by the prefix the caller wrote so that a larger struct of a newer minor
// reads as the fields this loader knows and a smaller one is refused before anything is read.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "kernel_hub/kernel_hub_abi.h"

namespace kh {

// `type` names the struct in messages ("kh_gemm_t"), `since` the ABI it came with ("1.2").
template <typename T>
int32_t read_abi_request(const T* in, T& out, uint32_t min_size, const char* type,
                         const char* since, std::string& error) {
  out = {};
  if (!in) {
    error = fmt::format("the request is NULL; pass a {} (kernel_hub_abi.h)", type);
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (in->h.abi_major != KH_ABI_MAJOR) {
    error = fmt::format("{} has ABI major {}, this loader reads {}", type, in->h.abi_major,
                        KH_ABI_MAJOR);
    return KH_ERR_ABI;
  }
  if (in->h.struct_size < min_size) {
    error = fmt::format(
        "{}.h.struct_size is {}, smaller than ABI {}'s {} ({} bytes); zero-initialize the struct "
        "and set h = KH_HEADER_INIT({})",
        type, in->h.struct_size, since, type, min_size, type);
    return KH_ERR_INVALID_ARGUMENT;
  }
  std::memcpy(&out, in, std::min<size_t>(in->h.struct_size, sizeof(T)));
  out.h.struct_size = sizeof(T);
  return KH_OK;
}

}  // namespace kh
