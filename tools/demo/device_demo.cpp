// run_device_demo: the demo run (demo.h) with the model resident on one CUDA device
// (DeviceCausalLM), timed with CUDA events on the model's stream.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "tools/demo/data.h"
#include "tools/demo/decode_roofline.h"
#include "tools/demo/demo.h"
#include "tools/demo/device_model.h"

namespace kh::demo {

namespace {

// One training step: the loss of the batch, gradients, AdamW.
float train_step(DeviceCausalLM& model, const BigramData::Batch& b, int batch, int seq,
                 const AdamConfig& adam) {
  model.zero_grad();
  const float loss = model.forward(b.inputs.data(), b.targets.data(), batch, seq);
  model.backward();
  model.adam_step(adam);
  return loss;
}

// The device time of `body` split by DeviceCausalLM's profile; other = the rest of the total.
template <typename F>
DemoRun::Breakdown profiled(DeviceCausalLM& model, F&& body) {
  DeviceEvent start(model.stream().device()), end(model.stream().device());
  model.take_profile();  // nothing left from before
  model.set_profiling(true);
  start.record(model.stream());
  body();
  end.record(model.stream());
  end.synchronize();
  model.set_profiling(false);
  const DeviceProfile p = model.take_profile();
  DemoRun::Breakdown b;
  b.total_ms = end.elapsed_ms_since(start);
  b.gemm_ms = p.gemm_ms;
  b.attention_ms = p.attention_ms;
  b.hub_ms = p.hub_ms;
  b.hub_ms_by_slot = p.hub_ms_by_slot;
  b.other_ms = std::max(0.0, b.total_ms - p.gemm_ms - p.attention_ms - p.hub_ms);
  return b;
}

void note_slots(const DeviceCausalLM& model, std::vector<std::string>& seen) {
  for (const std::string& s : model.package_slots())
    if (std::find(seen.begin(), seen.end(), s) == seen.end()) seen.push_back(s);
}

// Greedy generation of decode_batch held-out prompts with the paged KV cache, every decode step
// after the first a replay of the captured CUDA graph; tokens/s and the share of the HBM
// roofline from the timed steps (decode_roofline.h).
void decode(Runtime& rt, DeviceCausalLM& model, BigramData& data, const DemoOptions& o,
            const DecodeShape& shape, DemoRun& run) {
  const int B = shape.batch, n = decode_generated_tokens(shape.context), prompt = shape.context - n;
  // The read ceiling first, while the training's activations are freed and before the KV cache
  // exists: its 1 GiB stays under the peaks the run reports.
  run.read_bandwidth = model.read_bandwidth(int64_t{1} << 30);
  DecodeConfig dc;
  dc.max_batch = B;
  dc.max_context = shape.context;
  dc.overlap = o.decode_overlap;
  dc.gemm = o.decode_gemm;
  dc.fuse = o.decode_fuse;
  model.init_decode(rt, dc);
  BigramData::Batch p = data.next(B, prompt);
  const std::vector<int64_t> out = model.generate(p.inputs.data(), B, prompt, n, /*graph=*/true);
  run.decoded = true;
  run.decode_batch = B;
  run.decode_prompt = prompt;
  run.decode_generated = n;
  run.decode_steps = model.last_decode_steps();
  run.decode_ms = model.last_decode_ms();
  run.decode_graph = model.decode_graph_captured();
  run.decode_overlapped = model.decode_overlaps();
  run.decode_fused_qkv = model.decode_fuses_qkv();
  run.decode_fused_append = model.decode_fuses_append();
  run.decode_fused_silu = model.decode_fuses_silu();
  run.decode_fused_qk_norm = model.decode_fuses_qk_norm();
  run.decode_fused_norm = model.decode_fuses_norm();
  run.decode_fused_head = model.decode_fuses_head();
  run.decode_head_norm = model.decode_fuses_final_norm();
  run.decode_skinny_gemms = model.decode_skinny_gemms();
  run.decode_gemms = model.decode_gemms();
  // A bound package that refused the model (head_dim) leaves its bf16 cache to the runtime.
  run.decode_package = model.decode_uses_package() && !model.refusals().contains(kPagedAttention);
  const bool bf16_cache = model.decode_uses_package() || o.bf16;
  run.decode_cache_dtype = bf16_cache ? "bf16" : "fp32";
  if (run.decode_steps > 0 && run.decode_ms > 0) {
    run.decode_ms_per_step = run.decode_ms / run.decode_steps;
    run.decode_tokens_per_s = static_cast<double>(B) * run.decode_steps / (run.decode_ms / 1e3);
  }
  run.decode_average_context = timed_decode_context(prompt, n);
  const DecodeTraffic t = decode_step_traffic(o.model, o.bf16 ? 2 : 4, bf16_cache ? 2 : 4, B,
                                              run.decode_average_context);
  run.decode_weight_bytes = t.weight_bytes + t.embedding_bytes;
  run.decode_kv_bytes = t.kv_bytes;
  run.decode_step_bytes = t.total();
  if (run.decode_ms_per_step > 0)
    run.decode_bandwidth = run.decode_step_bytes / (run.decode_ms_per_step / 1e3);
  run.peak_bandwidth = o.peak_bandwidth;
  run.peak_bandwidth_source = o.peak_bandwidth_source;
  run.roofline_fraction =
      roofline_fraction(run.decode_step_bytes, run.decode_ms_per_step, o.peak_bandwidth);
  run.read_roofline_fraction =
      roofline_fraction(run.decode_step_bytes, run.decode_ms_per_step, run.read_bandwidth);
  // Row b: the prompt's last token, then n generated tokens.
  int follow = 0, total = 0;
  for (int b = 0; b < B; ++b) {
    int64_t prev = p.inputs[static_cast<size_t>(b) * prompt + prompt - 1];
    for (int i = 0; i < n; ++i) {
      const int64_t next = out[static_cast<size_t>(b) * n + i];
      follow += next == data.successor(prev);
      ++total;
      prev = next;
    }
  }
  run.decode_pattern_match = total > 0 ? static_cast<double>(follow) / total : 0.0;
  run.decode_peak_bytes = model.memory().peak_bytes;
  // generate() leaves one position of the context free: one more step, eager, profiled.
  if (o.profile) run.decode_profile = profiled(model, [&] { model.decode_step(nullptr, false); });
}

}  // namespace

DemoRun run_device_demo(Runtime& rt, const DemoSlots& slots, const DemoOptions& o) {
  check_demo_options(o);
  const DecodeShape decode_shape = resolve_decode(o);
  if (o.cuda_ordinal < 0)
    throw Error(ErrorKind::kInvalidInput, "demo: the device run needs a CUDA ordinal");
  if (o.prefill_reps < 1) throw Error(ErrorKind::kInvalidInput, "demo: prefill_reps must be >= 1");
  DeviceModelOptions mo;
  mo.dtype = o.bf16 ? kBF16 : kF32;
  if (o.loss_chunk_rows > 0) mo.loss_chunk_rows = o.loss_chunk_rows;
  mo.keep_normed = o.keep_normed;
  DeviceCausalLM model(o.model, o.weights, o.seed, slots, rt, o.cuda_ordinal, mo);
  DeviceStream& stream = model.stream();
  DemoRun run;
  run.on_device = true;
  run.dtype = o.bf16 ? "bf16" : "fp32";
  run.parameters = model.num_parameters();
  run.floor_loss = generator_entropy(o.model.vocab, o.follow);
  const int S = o.model.seq;
  const double tokens_per_batch = static_cast<double>(o.batch) * S;
  std::vector<std::string> seen;

  // Train. The first step compiles kernels and plans GEMMs: the rate counts the steps after it.
  rt.set_mode(Mode::kTrain);
  BigramData train(o.model.vocab, o.follow, o.data_seed, o.seed);
  // An event at the start of each timed step and one after the last, all created before the
  // loop: the rate from the first to the last, and each step's own time between neighbours (so
  // that drift over a run, clocks under the power limit, shows).
  const int first_timed = std::min(2, o.steps), timed_steps = o.steps - first_timed + 1;
  std::vector<std::unique_ptr<DeviceEvent>> marks;
  for (int i = 0; i <= timed_steps; ++i)
    marks.push_back(std::make_unique<DeviceEvent>(o.cuda_ordinal));
  auto t0 = std::chrono::steady_clock::now();
  for (int step = 1; step <= o.steps; ++step) {
    BigramData::Batch b = train.next(o.batch, S);
    if (step >= first_timed) marks[static_cast<size_t>(step - first_timed)]->record(stream);
    const float loss = train_step(model, b, o.batch, S, o.adam);
    note_slots(model, seen);
    if (!std::isfinite(loss))
      throw Error(ErrorKind::kUnsupported,
                  fmt::format("demo: training diverged at step {} (loss {}); try a lower --lr, "
                              "--dtype fp32, or --fallback to compare with the runtime's own "
                              "layers",
                              step, loss));
    run.train_loss.push_back(loss);
    if (o.on_step) o.on_step(step, o.steps, loss);
  }
  marks.back()->record(stream);
  marks.back()->synchronize();
  run.train_ms = ms_since(t0);
  run.train_tokens_per_s =
      tokens_per_batch * timed_steps / (marks.back()->elapsed_ms_since(*marks.front()) / 1e3);
  for (size_t i = 1; i < marks.size(); ++i)
    run.train_step_ms.push_back(marks[i]->elapsed_ms_since(*marks[i - 1]));
  if (o.profile) {
    BigramData::Batch b = train.next(o.batch, S);
    run.train_profile = profiled(model, [&] { train_step(model, b, o.batch, S, o.adam); });
  }
  model.zero_grad();  // training is over: eval, prefill and decode hold no gradient

  // Eval: one atomic store publishes the eval table.
  auto ts = std::chrono::steady_clock::now();
  rt.set_mode(Mode::kEval);
  run.mode_switch_us = ms_since(ts) * 1000.0;

  // Prefill: batch x seq tokens, each sequence's last logits (what generation needs).
  BigramData held_out(o.model.vocab, o.follow, o.data_seed, o.seed ^ 0x5eed5eed5eedULL);
  BigramData::Batch pb = held_out.next(o.batch, S);
  model.forward(pb.inputs.data(), nullptr, o.batch, S, DeviceCausalLM::Logits::kLast);  // warm-up
  DeviceEvent p_start(o.cuda_ordinal), p_end(o.cuda_ordinal);
  p_start.record(stream);
  for (int i = 0; i < o.prefill_reps; ++i)
    model.forward(pb.inputs.data(), nullptr, o.batch, S, DeviceCausalLM::Logits::kLast);
  p_end.record(stream);
  p_end.synchronize();
  run.prefill_ms = p_end.elapsed_ms_since(p_start) / o.prefill_reps;
  run.prefill_tokens_per_s = tokens_per_batch / (run.prefill_ms / 1e3);
  note_slots(model, seen);
  if (o.profile)
    run.prefill_profile = profiled(model, [&] {
      model.forward(pb.inputs.data(), nullptr, o.batch, S, DeviceCausalLM::Logits::kLast);
    });
  run.profiled = o.profile;

  // Held-out loss: the loss chunk by chunk, no [tokens, vocab] logits.
  t0 = std::chrono::steady_clock::now();
  double sum = 0;
  for (int i = 0; i < o.eval_batches; ++i) {
    BigramData::Batch b = held_out.next(o.batch, S);
    sum +=
        model.forward(b.inputs.data(), b.targets.data(), o.batch, S, DeviceCausalLM::Logits::kLast);
  }
  run.eval_loss = static_cast<float>(sum / o.eval_batches);
  run.eval_tokens = static_cast<int64_t>(o.eval_batches) * o.batch * S;
  run.eval_ms = ms_since(t0);
  note_slots(model, seen);

  greedy_continuation(held_out, o, S, run, [&](const std::vector<int64_t>& seq) {
    model.forward(seq.data(), nullptr, 1, static_cast<int>(seq.size()),
                  DeviceCausalLM::Logits::kLast);
    const std::vector<float> last = model.download_logits();
    return static_cast<int64_t>(std::max_element(last.begin(), last.end()) - last.begin());
  });
  note_slots(model, seen);

  run.peak_bytes = model.memory().peak_bytes;
  run.reserved_bytes = model.memory().reserved_bytes;
  std::vector<uint32_t> reported = {slots.rms_norm,
                                    slots.rotary,
                                    slots.silu_and_mul,
                                    slots.cross_entropy,
                                    slots.attention,
                                    slots.linear_cross_entropy,
                                    slots.fused_add_rms_norm,
                                    slots.silu_and_mul_recompute,
                                    slots.fused_add_rms_norm_from_output};
  if (model.config().qk_norm) {  // (a model without q/k norms has no use for these two)
    reported.push_back(slots.qk_norm_rotary);
    reported.push_back(slots.qk_norm_rotary_from_output);
  }
  if (decode_shape.context > 0) {
    decode(rt, model, held_out, o, decode_shape, run);
    note_slots(model, seen);
    for (const char* name : {kPagedKVAppend, kPagedAttention, kPagedAttentionWithKVAppend})
      if (const auto s = rt.find_slot(name)) reported.push_back(*s);
  }
  run.refused_slots = model.refusals();
  for (uint32_t s : reported) {
    if (s == kNoSlot) continue;
    const std::string name = rt.slot_name(s);
    const SlotServed served = slot_served(
        name, std::find(seen.begin(), seen.end(), name) != seen.end(),
        run.refused_slots.contains(name), rt.slot_binding(s, o.cuda_ordinal, Mode::kEval).bound);
    if (served == SlotServed::kPackage) run.package_slots.push_back(name);
    if (served == SlotServed::kRuntime) run.runtime_slots.push_back(name);
  }
  return run;
}

SlotServed slot_served(const std::string& slot, bool called, bool refused, bool bound) {
  if (called) return SlotServed::kPackage;
  // The decode slots stand in for each other (the fused one, or the two apart); any other bound
  // slot not called was served by the runtime's own code.
  const bool decode =
      slot == kPagedKVAppend || slot == kPagedAttention || slot == kPagedAttentionWithKVAppend;
  return decode && bound && !refused ? SlotServed::kNeither : SlotServed::kRuntime;
}

}  // namespace kh::demo
