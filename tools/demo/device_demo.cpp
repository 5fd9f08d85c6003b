// run_device_demo: the demo run (demo.h) with the model resident on one CUDA device
// (DeviceCausalLM), timed with CUDA events on the model's stream.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "tools/demo/data.h"
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

}  // namespace

DemoRun run_device_demo(Runtime& rt, const DemoSlots& slots, const DemoOptions& o) {
  check_demo_options(o);
  if (o.cuda_ordinal < 0)
    throw Error(ErrorKind::kInvalidInput, "demo: the device run needs a CUDA ordinal");
  if (o.prefill_reps < 1) throw Error(ErrorKind::kInvalidInput, "demo: prefill_reps must be >= 1");
  DeviceModelOptions mo;
  mo.dtype = o.bf16 ? kBF16 : kF32;
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
  DeviceEvent t_start(o.cuda_ordinal), t_end(o.cuda_ordinal);
  auto t0 = std::chrono::steady_clock::now();
  for (int step = 1; step <= o.steps; ++step) {
    BigramData::Batch b = train.next(o.batch, S);
    if (step == std::min(2, o.steps)) t_start.record(stream);
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
  t_end.record(stream);
  t_end.synchronize();
  run.train_ms = ms_since(t0);
  const int timed_steps = o.steps > 1 ? o.steps - 1 : 1;
  run.train_tokens_per_s = tokens_per_batch * timed_steps / (t_end.elapsed_ms_since(t_start) / 1e3);
  if (o.profile) {
    BigramData::Batch b = train.next(o.batch, S);
    run.train_profile = profiled(model, [&] { train_step(model, b, o.batch, S, o.adam); });
  }

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

  // Greedy continuation, one full forward per new token (no KV cache).
  t0 = std::chrono::steady_clock::now();
  BigramData::Batch p = held_out.next(1, S);
  run.prompt.assign(p.inputs.begin(), p.inputs.begin() + o.prompt_tokens);
  std::vector<int64_t> seq = run.prompt;
  const int n_new = std::min(o.generate_tokens, S - o.prompt_tokens);
  int matches = 0;
  for (int i = 0; i < n_new; ++i) {
    model.forward(seq.data(), nullptr, 1, static_cast<int>(seq.size()),
                  DeviceCausalLM::Logits::kLast);
    const std::vector<float> last = model.download_logits();
    const int64_t next = std::max_element(last.begin(), last.end()) - last.begin();
    if (next == held_out.successor(seq.back())) ++matches;
    seq.push_back(next);
    run.generated.push_back(next);
  }
  run.pattern_match = n_new > 0 ? static_cast<double>(matches) / n_new : 0.0;
  run.generate_ms = ms_since(t0);
  note_slots(model, seen);

  run.peak_bytes = model.memory().peak_bytes;
  run.refused_slots = model.refusals();
  for (uint32_t s : {slots.rms_norm, slots.rotary, slots.silu_and_mul, slots.cross_entropy,
                     slots.attention, slots.linear_cross_entropy, slots.fused_add_rms_norm}) {
    if (s == kNoSlot) continue;
    const std::string name = rt.slot_name(s);
    (std::find(seen.begin(), seen.end(), name) != seen.end() ? run.package_slots
                                                             : run.runtime_slots)
        .push_back(name);
  }
  return run;
}

}  // namespace kh::demo
