#include "tools/demo/demo.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/data.h"

namespace kh::demo {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void greedy_continuation(BigramData& held_out, const DemoOptions& o, int len, DemoRun& run,
                         const std::function<int64_t(const std::vector<int64_t>&)>& next_token) {
  const auto t0 = std::chrono::steady_clock::now();
  BigramData::Batch p = held_out.next(1, len);
  run.prompt.assign(p.inputs.begin(), p.inputs.begin() + o.prompt_tokens);
  std::vector<int64_t> seq = run.prompt;
  const int n_new = std::min(o.generate_tokens, len - o.prompt_tokens);
  int matches = 0;
  for (int i = 0; i < n_new; ++i) {
    const int64_t next = next_token(seq);
    if (next == held_out.successor(seq.back())) ++matches;
    seq.push_back(next);
    run.generated.push_back(next);
  }
  run.pattern_match = n_new > 0 ? static_cast<double>(matches) / n_new : 0.0;
  run.generate_ms = ms_since(t0);
}

float generator_entropy(int vocab, double follow) {
  const double noise = (1.0 - follow) / vocab;
  const double top = follow + noise;
  return static_cast<float>(-top * std::log(top) - (vocab - 1) * noise * std::log(noise));
}

void check_demo_options(const DemoOptions& o) {
  if (o.steps < 1 || o.batch < 1 || o.eval_batches < 1 || o.prompt_tokens < 1 ||
      o.prompt_tokens >= o.model.seq)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("demo: steps, batch and eval batches must be >= 1 and the prompt "
                            "1..{} tokens",
                            o.model.seq - 1));
}

DecodeShape resolve_decode(const DemoOptions& o) {
  DecodeShape d{o.decode_batch, o.decode_context};
  if (d.batch == 0) d.batch = o.model.hidden >= 1024 ? 64 : 8;
  if (d.batch < 1 || d.batch > 4096)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("demo: --decode-batch {}: decode 1..4096 sequences together", d.batch));
  if (d.context == 0)  // a model too short to time a decode step skips it
    return {d.batch, o.model.seq >= kMinDecodeContext ? std::min(2048, o.model.seq) : -1};
  if (d.context < kMinDecodeContext || d.context > o.model.seq)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("demo: --decode-context {}: the prompt and generated tokens of a "
                            "sequence take {}..{} positions (the model's --seq {}: raise --seq "
                            "for a longer context)",
                            d.context, kMinDecodeContext, o.model.seq, o.model.seq));
  return d;
}

int decode_generated_tokens(int context) {
  return std::min(256, context / 2);
}

DemoRun run_demo(Runtime& rt, const DemoSlots& slots, const DemoOptions& o) {
  check_demo_options(o);
  DemoRun run;
  CausalLM model =
      o.weights.empty() ? CausalLM(o.model, slots, o.seed) : CausalLM(o.model, slots, o.weights);
  SlotCaller call(rt, o.cuda_ordinal);
  run.parameters = model.num_parameters();
  run.floor_loss = generator_entropy(o.model.vocab, o.follow);
  const int S = o.model.seq;

  // Train: every slot serves its train binding (forward_train + backward).
  rt.set_mode(Mode::kTrain);
  BigramData train(o.model.vocab, o.follow, o.data_seed, o.seed);
  auto t0 = std::chrono::steady_clock::now();
  for (int step = 1; step <= o.steps; ++step) {
    BigramData::Batch b = train.next(o.batch, S);
    model.zero_grad();
    const float loss = model.forward(call, rt, b.inputs.data(), b.targets.data(), o.batch, S);
    if (!std::isfinite(loss))
      throw Error(ErrorKind::kUnsupported,
                  fmt::format("demo: training diverged at step {} (loss {}); rerun with "
                              "--fallback to compare with the runtime's own layers",
                              step, loss));
    model.backward(call);
    model.adam_step(o.adam);
    run.train_loss.push_back(loss);
    if (o.on_step) o.on_step(step, o.steps, loss);
  }
  run.train_ms = ms_since(t0);

  // Eval: one atomic store publishes the eval table; no I/O, nothing reloaded.
  auto ts = std::chrono::steady_clock::now();
  rt.set_mode(Mode::kEval);
  run.mode_switch_us = ms_since(ts) * 1000.0;

  // Held-out batches: the same language (successor table), another stream.
  BigramData held_out(o.model.vocab, o.follow, o.data_seed, o.seed ^ 0x5eed5eed5eedULL);
  t0 = std::chrono::steady_clock::now();
  double sum = 0;
  for (int i = 0; i < o.eval_batches; ++i) {
    BigramData::Batch b = held_out.next(o.batch, S);
    sum += model.forward(call, rt, b.inputs.data(), b.targets.data(), o.batch, S);
  }
  run.eval_loss = static_cast<float>(sum / o.eval_batches);
  run.eval_tokens = static_cast<int64_t>(o.eval_batches) * o.batch * S;
  run.eval_ms = ms_since(t0);

  greedy_continuation(held_out, o, S, run, [&](const std::vector<int64_t>& seq) {
    const int len = static_cast<int>(seq.size());
    model.forward(call, rt, seq.data(), nullptr, 1, len);
    const float* last = model.logits().data() + static_cast<size_t>(len - 1) * o.model.vocab;
    return static_cast<int64_t>(std::max_element(last, last + o.model.vocab) - last);
  });

  run.staging = call.stats();
  for (uint32_t s :
       {slots.rms_norm, slots.rotary, slots.silu_and_mul, slots.cross_entropy, slots.attention})
    if (call.staged(s)) run.staged_slots.push_back(rt.slot_name(s));
  return run;
}

}  // namespace kh::demo
