#include "tools/demo/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <vector>

namespace kh::demo {

namespace {

std::string short_digest(const Digest& d) {
  return d.empty() ? "-" : "sha256:" + d.hex.substr(0, 12);
}

}  // namespace

std::string binding_source_text(const KernelizeBinding& b) {
  std::string s = binding_source_name(b.source);
  if (b.source == BindingSource::kFallback || !b.resolution.variant) return s;
  const VariantChoice& v = *b.resolution.variant;
  switch (v.code) {
    case VariantCode::kHost:
      break;
    case VariantCode::kCubinExact:
    case VariantCode::kCubinCompatible:
      s += ", cubin sm_" + v.cubin_sm;
      break;
    case VariantCode::kNvrtcSource:
      s += ", NVRTC";
      break;
  }
  return s;
}

// "cuBLASLt", "skinny" or "skinny + cuBLASLt": where the decode step's GEMMs ran.
std::string decode_gemm_label(const DemoRun& run) {
  if (run.decode_skinny_gemms == 0) return "cuBLASLt";
  return run.decode_skinny_gemms == run.decode_gemms ? "skinny" : "skinny + cuBLASLt";
}

std::string binding_table(const KernelizeReport& report) {
  std::vector<std::vector<std::string>> rows = {
      {"LAYER", "MODE", "PACKAGE", "DIGEST", "VARIANT", "SOURCE", "LOAD"}};
  for (const KernelizeBinding& b : report.bindings) {
    if (b.source == BindingSource::kFallback) {
      // A layer the config maps here that no entry could serve says so (its reason below).
      rows.push_back({b.layer, mode_name(b.mode), "runtime fallback", "-", "-",
                      b.resolution.unserved.empty() ? "fallback" : "fallback (UNSERVED)", "-"});
    } else {
      rows.push_back({b.layer, mode_name(b.mode), b.package, short_digest(b.index_digest),
                      b.variant, binding_source_text(b), fmt::format("{:.1f} ms", b.load_ms)});
    }
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::string out;
  for (auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c)
      line += c + 1 < r.size() ? fmt::format("{:<{}}  ", r[c], width[c]) : r[c];
    out += line + "\n";
  }
  // Why each fallback serves, one line per distinct reason (KERNEL_HUB_DISABLE gives all one).
  std::vector<std::pair<std::string, std::vector<std::string>>> notes;
  for (const KernelizeBinding& b : report.bindings) {
    if (b.source != BindingSource::kFallback || b.note.empty()) continue;
    auto it = std::find_if(notes.begin(), notes.end(), [&](auto& n) { return n.first == b.note; });
    if (it == notes.end()) it = notes.insert(notes.end(), {b.note, {}});
    it->second.push_back(fmt::format("{} {}", b.layer, mode_name(b.mode)));
  }
  for (auto& [note, who] : notes)
    out += fmt::format("  {}: {}\n",
                       who.size() == report.bindings.size() && who.size() > 1
                           ? std::string("every slot")
                           : fmt::format("{}", fmt::join(who, ", ")),
                       note);
  return out;
}

nlohmann::json demo_json(const DemoSummary& summary, const DemoOptions& o,
                         const KernelizeReport& report, const DemoRun& run) {
  nlohmann::json bindings = nlohmann::json::array();
  for (const KernelizeBinding& b : report.bindings) {
    nlohmann::json j = {{"layer", b.layer},
                        {"mode", mode_name(b.mode)},
                        {"source", binding_source_name(b.source)},
                        {"load_ms", b.load_ms}};
    if (b.source == BindingSource::kFallback) {
      j["note"] = b.note;
      if (!b.resolution.unserved.empty()) j["unserved"] = b.resolution.unserved;
    } else {
      j["package"] = b.package;
      j["kernel"] = b.kernel;
      j["index_digest"] = b.index_digest.str();
      j["variant_digest"] = b.variant_digest ? b.variant_digest->str() : "";
      j["variant"] = b.variant;
      j["source_detail"] = binding_source_text(b);
    }
    bindings.push_back(std::move(j));
  }
  const ModelConfig& m = o.model;
  nlohmann::json out = {
      {"device", summary.device},
      {"kernelize_device", report.device.str()},
      {"fallback_only", summary.fallback_only},
      {"model",
       {{"name", m.name},
        {"arch", arch_name(m.arch)},
        {"vocab", m.vocab},
        {"hidden", m.hidden},
        {"layers", m.layers},
        {"heads", m.heads},
        {"kv_heads", m.kv_heads},
        {"head_dim", m.head_dim},
        {"qk_norm", m.qk_norm},
        {"qkv_bias", m.qkv_bias},
        {"tie_embeddings", m.tie_embeddings},
        {"checkpoint", !o.weights.empty()},
        {"ffn", m.ffn},
        {"seq", m.seq},
        {"batch", o.batch},
        {"parameters", run.parameters},
        {"optimizer", fmt::format("adamw lr {} weight decay {}", o.adam.lr, o.adam.weight_decay)},
        {"seed", o.seed}}},
      {"bindings", std::move(bindings)},
      {"fetched", report.fetched},
      {"train",
       {{"steps", run.train_loss.size()},
        {"first_loss", run.train_loss.empty() ? 0.f : run.train_loss.front()},
        {"last_loss", run.train_loss.empty() ? 0.f : run.train_loss.back()},
        {"losses", run.train_loss}}},
      {"eval",
       {{"loss", run.eval_loss},
        {"tokens", run.eval_tokens},
        {"floor_loss", run.floor_loss},
        {"mode_switch_us", run.mode_switch_us}}},
      {"generation",
       {{"prompt", run.prompt}, {"tokens", run.generated}, {"pattern_match", run.pattern_match}}},
      {"staging",
       {{"staged_slots", run.staged_slots},
        {"staged_calls", run.staging.staged_calls},
        {"host_calls", run.staging.host_calls},
        {"bytes_to_device", run.staging.bytes_to_device},
        {"bytes_to_host", run.staging.bytes_to_host},
        {"device_bytes", run.staging.device_bytes}}},
      {"timings_ms",
       {{"kernelize", summary.kernelize_ms},
        {"train", run.train_ms},
        {"per_step", run.train_loss.empty() ? 0.0 : run.train_ms / run.train_loss.size()},
        {"eval", run.eval_ms},
        {"generate", run.generate_ms},
        {"total", summary.total_ms}}},
  };
  if (run.on_device) {
    auto breakdown = [](const DemoRun::Breakdown& b) {
      return nlohmann::json{{"total_ms", b.total_ms},
                            {"gemm_ms", b.gemm_ms},
                            {"attention_ms", b.attention_ms},
                            {"hub_kernels_ms", b.hub_ms},
                            {"hub_kernels_ms_by_slot", b.hub_ms_by_slot},
                            {"other_ms", b.other_ms}};
    };
    nlohmann::json d = {
        {"dtype", run.dtype},
        {"train_tokens_per_s", run.train_tokens_per_s},
        {"train_step_ms", run.train_step_ms},
        {"prefill_tokens_per_s", run.prefill_tokens_per_s},
        {"prefill_ms", run.prefill_ms},
        {"peak_bytes", run.peak_bytes},
        {"reserved_bytes", run.reserved_bytes},
        {"package_slots", run.package_slots},
        {"runtime_slots", run.runtime_slots},
        {"refused_slots", run.refused_slots},
    };
    if (run.decoded)
      d["decode"] = {
          {"batch", run.decode_batch},
          {"prompt_tokens", run.decode_prompt},
          {"generated_tokens", run.decode_generated},
          {"timed_steps", run.decode_steps},
          {"ms", run.decode_ms},
          {"ms_per_step", run.decode_ms_per_step},
          {"tokens_per_s", run.decode_tokens_per_s},
          {"average_context", run.decode_average_context},
          {"cuda_graph", run.decode_graph},
          {"package", run.decode_package},
          {"overlapped_halves", run.decode_overlapped},
          {"fused_qkv", run.decode_fused_qkv},
          {"fused_append", run.decode_fused_append},
          {"fused_silu", run.decode_fused_silu},
          {"fused_qk_norm", run.decode_fused_qk_norm},
          {"fused_norm", run.decode_fused_norm},
          {"fused_head_argmax", run.decode_fused_head},
          {"fused_final_norm", run.decode_head_norm},
          {"gemm", decode_gemm_label(run)},
          {"skinny_gemms", run.decode_skinny_gemms},
          {"gemms", run.decode_gemms},
          {"cache_dtype", run.decode_cache_dtype},
          {"step_bytes", run.decode_step_bytes},
          {"weight_bytes", run.decode_weight_bytes},
          {"kv_bytes", run.decode_kv_bytes},
          {"bandwidth_bytes_per_s", run.decode_bandwidth},
          {"peak_bandwidth_bytes_per_s", run.peak_bandwidth},
          {"peak_bandwidth_source", run.peak_bandwidth_source},
          {"roofline_fraction", run.roofline_fraction},
          {"read_bandwidth_bytes_per_s", run.read_bandwidth},
          {"read_roofline_fraction", run.read_roofline_fraction},
          {"pattern_match", run.decode_pattern_match},
          {"peak_bytes", run.decode_peak_bytes},
      };
    if (run.profiled) {
      d["profile"]["train_step"] = breakdown(run.train_profile);
      d["profile"]["prefill"] = breakdown(run.prefill_profile);
      if (run.decoded) d["profile"]["decode_step"] = breakdown(run.decode_profile);
    }
    out["device_run"] = std::move(d);
    out.erase("staging");  // nothing is staged: the model lives on the device
  }
  return out;
}

}  // namespace kh::demo
