// The HBM roofline of one greedy decode step (device_decode.h): the bytes a step must read at
// the least, and the share of the device's peak memory bandwidth a measured step reaches. Pure
// arithmetic, so that a CPU test checks it; `kernel-hub demo --device cuda:N` prints it.
//
// A step reads every weight once (in the dtype the model runs: the bf16 copies of a bf16 model;
// the LM head counts, once even when tied to the embedding), the batch's embedding rows (a
// gather, not the table) and, per sequence, the K and V cache of every layer up to its current
// length. Activations, the logits and the one appended K/V row are small beside these and are
// left out: the roofline is what no implementation can avoid reading.
#pragma once

#include <cstdint>

#include "tools/demo/model_config.h"

namespace kh::demo {

struct DecodeTraffic {
  double weight_bytes = 0;     // every weight of the step, the LM head included
  double embedding_bytes = 0;  // the batch's embedding rows
  double kv_bytes = 0;         // K and V of every layer at the sequences' (average) length
  double total() const { return weight_bytes + embedding_bytes + kv_bytes; }
};

// One step of `batch` sequences whose caches hold `context` tokens each (the average over the
// timed steps: timed_decode_context), weights of `weight_bytes` per element, the cache of
// `kv_bytes` per element.
DecodeTraffic decode_step_traffic(const ModelConfig& config, int weight_bytes, int kv_bytes,
                                  int64_t batch, double context);

// The average tokens in each sequence's cache over the decode steps DeviceCausalLM::generate
// times for a prompt of `prompt` tokens and `n` generated (steps 2 .. n - 1: step k attends
// prompt + k tokens).
double timed_decode_context(int prompt, int n);

// Peak memory bandwidth in bytes/s from the driver's attributes: the memory clock (kHz) times
// the bus width (bits) times 2 (double data rate), over 8 bits a byte.
double peak_memory_bandwidth(int memory_clock_khz, int bus_width_bits);

// H200's specified HBM3e bandwidth, when the driver cannot be asked (shared/REFERENCE.md 6.1).
inline constexpr double kH200PeakBandwidth = 4.8e12;

// bytes read per step over the step's time, as a share of `peak_bytes_per_s` (0 when either is
// not positive).
double roofline_fraction(double bytes, double step_ms, double peak_bytes_per_s);

}  // namespace kh::demo
