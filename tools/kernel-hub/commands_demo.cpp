// demo: the demo model runtime (tools/demo) end to end: declare the layer slots, kernelize them
// from a KernelConfig through this CLI's hub and cache, build the model (a preset at random init
// or a Transformers checkpoint), train it in train mode, switch to eval, evaluate and generate,
// and show which kernel served each slot.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "hub/base/clock.h"
#include "hub/base/error.h"
#include "loader/cuda_driver.h"
#include "registry/device.h"
#include "registry/kernel_config.h"
#include "registry/kernelize.h"
#include "tools/demo/checkpoint.h"
#include "tools/demo/decode_roofline.h"
#include "tools/demo/default_config.h"
#include "tools/demo/demo.h"
#include "tools/demo/device_decode.h"
#include "tools/demo/report.h"
#include "tools/kernel-hub/cli.h"

namespace kh::cli {

namespace {

struct DemoArgs {
  std::string device;          // empty: cuda:0 when a CUDA device is present, else cpu
  std::string config;          // empty: the embedded manifests/examples/demo-config.json
  std::string model = "tiny";  // a preset name or a checkpoint directory
  int steps = 200;
  int batch = 8;
  int seq = 32;
  uint64_t seed = 1;
  float lr = 0;       // 0: 1e-2 for tiny, 3e-4 for the other models
  std::string dtype;  // empty: bf16 on a CUDA device, fp32 on the cpu
  bool profile = false;
  bool fallback = false;
  int decode_batch = 0;        // 0: 64 for qwen3-0.6b and larger, 8 for tiny (demo::resolve_decode)
  int decode_context = 0;      // 0: 2048 capped by --seq
  std::string decode_overlap;  // empty: off
  std::string decode_gemm;     // empty: auto
  std::string decode_fuse;     // empty: on
  int loss_chunk = 0;          // 0: the device model's default
  std::string keep_normed;     // empty: auto
};

bool cuda_present() {
  try {
    return cuda::device_count() > 0;
  } catch (const Error&) {  // no driver, no device: the cpu it is
    return false;
  }
}

// "cpu" -> -1; "cuda" / "cuda:N" -> N.
int parse_ordinal(const std::string& text) {
  if (text == "cpu") return kCpuDevice;
  if (text == "cuda") return 0;
  if (text.starts_with("cuda:")) {
    const std::string n = text.substr(5);
    if (!n.empty() && n.size() <= 3 && std::all_of(n.begin(), n.end(), ::isdigit))
      return std::stoi(n);
  }
  throw Error(ErrorKind::kInvalidInput,
              fmt::format("demo: --device '{}': expected cpu or cuda:N (a GPU ordinal)", text));
}

// The device kernelize resolves for; a CUDA device must really be there.
Device demo_device(const std::string& text, int ordinal) {
  if (ordinal == kCpuDevice) return local_cpu_device();
  try {
    cuda::device(ordinal);
  } catch (const Error& e) {
    throw Error(ErrorKind::kNotFound,
                fmt::format("demo: --device {} is not usable: {}\nTo run the demo without "
                            "a GPU: kernel-hub demo --device cpu",
                            text, e.what()));
  }
  DeviceFields f;
  f.key = fmt::format("cuda:{}", ordinal);
  return make_device(f);
}

// The decode roofline's peak: the driver's memory clock x bus width x 2 (double data rate), or
// H200's specified 4.8 TB/s when the driver does not say.
std::pair<double, std::string> peak_bandwidth(int ordinal) {
  const cuda::Driver& d = cuda::cuda_driver();
  const cuda::CUdevice dev = cuda::device(ordinal).handle;
  int clock_khz = 0, bus_bits = 0;
  if (d.cuDeviceGetAttribute(&clock_khz, cuda::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, dev) ==
          cuda::CUDA_SUCCESS &&
      d.cuDeviceGetAttribute(&bus_bits, cuda::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, dev) ==
          cuda::CUDA_SUCCESS &&
      clock_khz > 0 && bus_bits > 0)
    return {
        demo::peak_memory_bandwidth(clock_khz, bus_bits),
        fmt::format("driver: {} MHz memory clock x {}-bit bus x 2", clock_khz / 1000, bus_bits)};
  return {demo::kH200PeakBandwidth,
          "assumed: H200's 4.8 TB/s (the driver did not report the memory clock and bus width)"};
}

// A progress bar on a terminal; otherwise a few loss lines.
class StepReporter {
 public:
  StepReporter(Context& ctx, int steps)
      : ctx_(ctx),
        bar_(!ctx.options().quiet && !ctx.options().json && ::isatty(STDERR_FILENO)),
        every_(std::max(1, steps / 4)),
        start_(std::chrono::steady_clock::now()) {}

  void operator()(int step, int steps, float loss) {
    if (!bar_) {
      if (step == 1 || step % every_ == 0 || step == steps)
        ctx_.say(fmt::format("  step {:>4}/{}  loss {:.4f}", step, steps, loss));
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (step != steps && now - last_ < std::chrono::milliseconds(80)) return;
    last_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    constexpr int kWidth = 30;
    const int filled = step * kWidth / steps;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\rtrain [%s] %4d/%d  loss %.4f  %.0f steps/s ", bar.c_str(), step, steps,
                 loss, secs > 0 ? step / secs : 0.0);
    if (step == steps) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  Context& ctx_;
  bool bar_;
  int every_;
  std::chrono::steady_clock::time_point start_, last_;
};

std::string tokens_text(const std::vector<int64_t>& tokens) {
  return fmt::format("[{}]", fmt::join(tokens, " "));
}

int run_demo_command(Context& ctx, const DemoArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string device_text = a.device.empty() ? (cuda_present() ? "cuda:0" : "cpu") : a.device;
  const int ordinal = parse_ordinal(device_text);
  const Device device = demo_device(device_text, ordinal);
  const KernelConfig config =
      a.config.empty()
          ? KernelConfig::parse(demo::default_demo_config_json(), "demo-config.json (built in)")
          : KernelConfig::load(a.config);
  if (ctx.options().verbose)
    set_log_sink([](int, const std::string& line) { std::cerr << "kernel-hub: " << line << "\n"; });

  demo::DemoOptions o;
  const bool is_preset = std::ranges::count(demo::preset_names(), a.model) > 0;
  if (is_preset || !std::filesystem::is_directory(a.model)) {
    o.model = demo::preset(a.model);  // not a directory: the error lists the presets
  } else {
    demo::Checkpoint ckpt = demo::load_checkpoint(a.model);
    o.model = ckpt.config;
    o.weights = std::move(ckpt.weights);
  }
  o.model.seq = a.seq;
  o.model.validate();
  o.batch = a.batch;
  o.steps = a.steps;
  o.seed = a.seed;
  o.adam.lr = a.lr > 0 ? a.lr : (o.model.hidden >= 1024 ? 3e-4f : 1e-2f);
  o.cuda_ordinal = ordinal;
  const std::string dtype = a.dtype.empty() ? (ordinal >= 0 ? "bf16" : "fp32") : a.dtype;
  if (ordinal < 0 && (dtype != "fp32" || a.profile || a.decode_batch || a.decode_context ||
                      !a.decode_overlap.empty() || !a.decode_gemm.empty() ||
                      !a.decode_fuse.empty() || a.loss_chunk || !a.keep_normed.empty()))
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("demo: {} needs a CUDA device (the CPU model is fp32, unprofiled and "
                            "generates without a KV cache); use --device cuda:N",
                            a.profile                   ? "--profile"
                            : a.decode_batch            ? "--decode-batch"
                            : a.decode_context          ? "--decode-context"
                            : !a.decode_overlap.empty() ? "--decode-overlap"
                            : !a.decode_gemm.empty()    ? "--decode-gemm"
                            : !a.decode_fuse.empty()    ? "--decode-fuse"
                            : a.loss_chunk              ? "--loss-chunk"
                            : !a.keep_normed.empty()    ? "--keep-normed"
                                                        : "--dtype " + dtype));
  o.bf16 = dtype == "bf16";
  o.profile = a.profile;
  o.decode_batch = a.decode_batch;
  o.decode_context = a.decode_context;
  o.decode_overlap =
      a.decode_overlap == "on" ? demo::DecodeOverlap::kOn : demo::DecodeOverlap::kOff;
  o.decode_gemm = a.decode_gemm == "skinny"     ? demo::DecodeGemm::kSkinny
                  : a.decode_gemm == "cublaslt" ? demo::DecodeGemm::kCublasLt
                                                : demo::DecodeGemm::kAuto;
  o.decode_fuse = a.decode_fuse == "off" ? demo::DecodeFuse::kOff : demo::DecodeFuse::kOn;
  if (a.loss_chunk) o.loss_chunk_rows = a.loss_chunk;
  o.keep_normed = a.keep_normed == "on"    ? demo::KeepNormed::kOn
                  : a.keep_normed == "off" ? demo::KeepNormed::kOff
                                           : demo::KeepNormed::kAuto;
  if (ordinal >= 0) {
    demo::resolve_decode(o);  // refuses a bad --decode-* before anything is fetched
    std::tie(o.peak_bandwidth, o.peak_bandwidth_source) = peak_bandwidth(ordinal);
  }
  const demo::ModelConfig& m = o.model;

  // The runtime: slots with the runtime's own implementations, then kernelize binds every mode
  // up front (resolve, fetch into the cache, verify, load) for this device.
  RuntimeOptions ro;
  ro.jit_cache_dir = ctx.store().root() / "jit";
  Runtime rt(ro);
  // On a CUDA device the model is resident there (device_model.h) and has one slot more: the
  // fused LM head + cross-entropy of its train loss.
  // Its eval decode has three more: PagedKVAppend and PagedAttention (the paged KV cache), and
  // PagedAttentionWithKVAppend (both in one launch).
  const demo::DemoSlots slots =
      ordinal >= 0 ? demo::add_device_demo_slots(rt) : demo::add_demo_slots(rt);
  if (ordinal >= 0) demo::add_decode_slots(rt);
  KernelizeOptions ko;
  ko.cuda_ordinal = ordinal < 0 ? 0 : ordinal;
  if (a.fallback) ko.disable = true;  // else KERNEL_HUB_DISABLE decides
  const auto tk = std::chrono::steady_clock::now();
  const KernelizeReport report = kernelize(rt, config, ctx.hub(), device, ko);
  const double kernelize_ms = ms_since(tk);

  ctx.say(fmt::format("kernel-hub demo: {} LM, {}, {} ({}), batch {} x {} on {}{}", m.name, dtype,
                      is_preset ? "random init" : "checkpoint", m.describe(), o.batch, m.seq,
                      device_text, ordinal >= 0 ? " (model resident on the device)" : ""));
  size_t bound = 0;
  for (auto& b : report.bindings) bound += b.source != BindingSource::kFallback;
  ctx.say(
      fmt::format("kernelize: {} of {} slot bindings from packages ({} variants fetched) in "
                  "{:.1f} ms",
                  bound, report.bindings.size(), report.fetched, kernelize_ms));
  ctx.say(fmt::format("train: {} steps, adamw lr {}, synthetic successor language (seed {})",
                      a.steps, o.adam.lr, a.seed));
  StepReporter reporter(ctx, a.steps);
  o.on_step = [&reporter](int step, int steps, float loss) { reporter(step, steps, loss); };

  const demo::DemoRun run =
      ordinal >= 0 ? demo::run_device_demo(rt, slots, o) : demo::run_demo(rt, slots, o);

  demo::DemoSummary summary;
  summary.device = device_text;
  summary.fallback_only = bound == 0;
  summary.kernelize_ms = kernelize_ms;
  summary.total_ms = ms_since(t0);
  if (ctx.options().json) {
    ctx.print_json(demo::demo_json(summary, o, report, run));
    return 0;
  }
  ctx.say(fmt::format("train: loss {:.4f} -> {:.4f} in {:.2f} s ({:.1f} ms/step, {} parameters)",
                      run.train_loss.front(), run.train_loss.back(), run.train_ms / 1000,
                      run.train_ms / run.train_loss.size(), run.parameters));
  ctx.say(
      fmt::format("eval: set_mode(eval) in {:.2f} us; held-out loss {:.4f} over {} tokens "
                  "(the generator's entropy, the best possible, is {:.4f})",
                  run.mode_switch_us, run.eval_loss, run.eval_tokens, run.floor_loss));
  ctx.say(fmt::format("generate: prompt {} -> {} ({:.0f}% follow the pattern)",
                      tokens_text(run.prompt), tokens_text(run.generated),
                      run.pattern_match * 100));
  if (run.on_device) {
    ctx.say(
        fmt::format("throughput ({}, CUDA events): train {:.0f} tokens/s, prefill {:.0f} "
                    "tokens/s ({:.2f} ms per {} x {} batch, last-token logits)",
                    run.dtype, run.train_tokens_per_s, run.prefill_tokens_per_s, run.prefill_ms,
                    o.batch, m.seq));
    if (run.decoded) {
      ctx.say(fmt::format(
          "decode ({} cache, {}, {}): {} sequences x {}-token prompts + {} tokens: {:.0f} "
          "tokens/s, {:.3f} ms per step ({} timed steps{}{}{}{}{}{}{}{})",
          run.decode_cache_dtype, run.decode_graph ? "CUDA graph" : "eager",
          run.decode_package ? "PagedAttention from the package" : "the runtime's attention",
          run.decode_batch, run.decode_prompt, run.decode_generated, run.decode_tokens_per_s,
          run.decode_ms_per_step, run.decode_steps,
          run.decode_overlapped ? ", two overlapped halves" : "",
          run.decode_fused_qkv ? ", one q/k/v GEMM" : "",
          run.decode_fused_append ? ", K/V appended by the attention" : "",
          run.decode_fused_qk_norm ? ", q/k norms and RoPE in the q/k/v GEMM" : "",
          run.decode_fused_silu ? ", SiluAndMul in the gate/up GEMM" : "",
          run.decode_fused_norm ? ", the add + norms between projections in their GEMMs" : "",
          !run.decode_fused_head ? ""
          : run.decode_head_norm ? ", the final norm and greedy argmax in the LM head's GEMM"
                                 : ", the greedy argmax in the LM head's GEMM",
          run.decode_skinny_gemms
              ? fmt::format(", {} of {} GEMMs skinny", run.decode_skinny_gemms, run.decode_gemms)
              : ""));
      ctx.say(fmt::format(
          "  roofline: a step reads {} (weights {} + KV cache {} at {:.0f} tokens a sequence) "
          "= {:.2f} TB/s, {:.0f}% of the {:.2f} TB/s peak ({}), {:.0f}% of the {:.2f} TB/s a "
          "plain read reached in this run",
          human_bytes(static_cast<uint64_t>(run.decode_step_bytes)),
          human_bytes(static_cast<uint64_t>(run.decode_weight_bytes)),
          human_bytes(static_cast<uint64_t>(run.decode_kv_bytes)), run.decode_average_context,
          run.decode_bandwidth / 1e12, run.roofline_fraction * 100, run.peak_bandwidth / 1e12,
          run.peak_bandwidth_source, run.read_roofline_fraction * 100, run.read_bandwidth / 1e12));
      ctx.say(fmt::format("  {:.0f}% of the generated tokens follow the learned pattern",
                          run.decode_pattern_match * 100));
    }
    ctx.say(fmt::format("memory: peak {} on {} (the model's device pool){}",
                        human_bytes(run.peak_bytes), device_text,
                        run.decoded ? fmt::format("; {} with the decode's KV cache",
                                                  human_bytes(run.decode_peak_bytes))
                                    : std::string()));
    auto names = [](const std::vector<std::string>& v) {
      return v.empty() ? std::string("none") : fmt::format("{}", fmt::join(v, ", "));
    };
    ctx.say(fmt::format("slots: package kernels ran for {}; the runtime's own kernels for {}",
                        names(run.package_slots), names(run.runtime_slots)));
    for (const auto& [slot, why] : run.refused_slots)
      ctx.say(
          fmt::format("  {}: bound, but the package refused this model, so the runtime's "
                      "kernels served it: {}",
                      slot, why));
    if (run.profiled)
      for (auto& [what, b] :
           {std::pair{"train step", run.train_profile}, std::pair{"prefill", run.prefill_profile},
            std::pair{"decode step (eager)", run.decode_profile}}) {
        if (b.total_ms == 0) continue;  // no decode
        ctx.say(
            fmt::format("profile {}: {:.2f} ms = GEMM {:.2f} + attention {:.2f} + hub kernels "
                        "{:.2f} + other {:.2f}",
                        what, b.total_ms, b.gemm_ms, b.attention_ms, b.hub_ms, b.other_ms));
        std::string by_slot;
        for (const auto& [slot, ms] : b.hub_ms_by_slot)
          by_slot += fmt::format("{}{} {:.2f}", by_slot.empty() ? "" : ", ", slot, ms);
        if (!by_slot.empty()) ctx.say(fmt::format("  hub kernels by slot: {}", by_slot));
      }
  }
  ctx.say("bindings:");
  std::cout << demo::binding_table(report);
  ctx.say(fmt::format("total {:.2f} s", summary.total_ms / 1000));
  return 0;
}

}  // namespace

void add_demo_command(CLI::App& app, Runner& run) {
  auto a = std::make_shared<DemoArgs>();
  auto* cmd = app.add_subcommand(
      "demo",
      "Train and run a Llama / Qwen2 / Qwen3 language model (fp32; a preset at random init or a "
      "Transformers checkpoint) whose RMSNorm, RotaryEmbedding, SiluAndMul, Attention and "
      "CrossEntropy layers are slots of a kernel-hub layer table, kernelized from "
      "a KernelConfig (default: manifests/examples/demo-config.json, built in) through the hub "
      "and cache: trains in train mode, switches to eval, evaluates on held-out batches, "
      "generates greedily and prints which kernel served each slot. --json for a summary. "
      "With --device cuda:N the model lives on the GPU (weights, gradients, AdamW state and "
      "activations; bf16 with fp32 master weights by default, --dtype fp32), slots get device "
      "tensors, the train loss is the fused LM head + cross-entropy, and it also prints train "
      "and prefill tokens/s, greedy decode tokens/s with a paged KV cache and a CUDA-graph step "
      "(and its share of the HBM roofline), peak device memory and, with --profile, where the "
      "step's time goes.");
  cmd->add_option("--device", a->device,
                  "cpu or cuda:N (default: cuda:0 when a CUDA device is present, else cpu)");
  cmd->add_option("--config", a->config,
                  "KernelConfig JSON file (default: the built-in demo-config.json)");
  cmd->add_option("--model", a->model,
                  "A preset (tiny, qwen3-0.6b, llama-3-8b-layers; default tiny) or a Transformers "
                  "checkpoint directory (config.json with model_type llama, qwen2 or qwen3, and "
                  "model.safetensors or model.safetensors.index.json)");
  cmd->add_option("--steps", a->steps, "Training steps (default 200)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--batch", a->batch, "Sequences per step (default 8)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--seq", a->seq, "Tokens per sequence (default 32)")
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--seed", a->seed, "Seed of the model and the training data (default 1)");
  cmd->add_option(
         "--lr", a->lr,
         "AdamW learning rate (default 0.01; 0.0003 for models of hidden size 1024 and more, "
         "such as qwen3-0.6b)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dtype", a->dtype,
                  "bf16 (fp32 master weights) or fp32; CUDA only (default bf16 on a GPU, fp32 "
                  "on the cpu)")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  cmd->add_flag("--profile", a->profile,
                "CUDA only: one more train step and prefill with CUDA events around every "
                "GEMM, attention and package call; prints the breakdown");
  cmd->add_option("--decode-batch", a->decode_batch,
                  "CUDA only: sequences decoded together (default 64 for qwen3-0.6b and larger "
                  "models, 8 for tiny)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--decode-context", a->decode_context,
                  "CUDA only: prompt + generated tokens of each decoded sequence (default 2048, "
                  "at most --seq; the last min(256, half) are generated)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--decode-overlap", a->decode_overlap,
                  "CUDA only: on runs the decode batch (2 sequences or more) as two halves on two "
                  "streams, one half's attention beside the other's projections and MLP (default "
                  "off: slower on an H200 at 64 x 2048)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--decode-gemm", a->decode_gemm,
                  "CUDA only: the decode step's GEMMs: auto (the runtime's own skinny GEMM where "
                  "it beats cuBLASLt: bf16, up to 64 rows, on Hopper, weights wider than tall "
                  "with at most 2048 rows), cublaslt, or skinny (the skinny GEMM wherever it takes "
                  "the shapes) (default auto)")
      ->check(CLI::IsMember({"auto", "cublaslt", "skinny"}));
  cmd->add_option("--decode-fuse", a->decode_fuse,
                  "CUDA only: on folds layers into the decode step's GEMMs where the runtime's "
                  "skinny GEMM runs them (bf16, Hopper, not with --decode-gemm cublaslt): Qwen3's "
                  "q/k norms and RoPE into the q/k/v GEMM, SiluAndMul into the gate/up GEMM, so "
                  "decode launches neither slot, and (one batch, not --decode-overlap) the "
                  "residual add + RMSNorm between projections into the o and down GEMMs and the "
                  "next GEMM (eval keeps a copy of the q/k/v and gate/up weights with the norms' "
                  "weights folded in); off calls the slots every step (default on)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--loss-chunk", a->loss_chunk,
                  "CUDA only: tokens a chunk of the train loss (the LM head and cross-entropy "
                  "without the whole logits: a chunk's rows x vocab logits at a time; longer "
                  "chunks are faster and take rows x vocab x 2 more bytes in bf16) (default "
                  "2048)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--keep-normed", a->keep_normed,
                  "CUDA only: whether the train forward keeps each layer's normed inputs and "
                  "rotated q and k for the backward (three fewer recomputing passes a layer: "
                  "about 2% faster). auto keeps them where the FromOutput slots (norm >= 1.1, "
                  "rotary >= 1.3) let them replace the residuals and q/k projections: no more "
                  "memory; on keeps them all, beside those inputs where no FromOutput slot "
                  "serves (4.7 GB more at Qwen3-0.6B's 8 x 2048 tokens); off recomputes them "
                  "(default auto)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_flag("--fallback", a->fallback,
                "Bind no package: every slot runs the runtime's own implementation (as "
                "KERNEL_HUB_DISABLE=1)");
  cmd->callback([&run, a] { run = [a](Context& ctx) { return run_demo_command(ctx, *a); }; });
}

}  // namespace kh::cli
