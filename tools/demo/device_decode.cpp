// Eval decode of the GPU-resident runtime (device_decode.h): the paged KV cache, prefill into it,
// the decode step (eager or a replayed CUDA graph) and greedy generation.
#include "tools/demo/device_decode.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/device_linear.h"
#include "tools/demo/device_model.h"

namespace kh::demo {

namespace {

constexpr uint32_t kThreads = 128;  // the decode kernels' block

// paged_attention_decode splits the context over 32 parts at most when it gets an fp32
// workspace of batch * q_tokens * q_heads * 32 * (head_dim + 2) elements (README, attention).
constexpr int64_t kDecodeSplits = 32;

[[noreturn]] void invalid(const std::string& why) {
  throw Error(ErrorKind::kInvalidInput, "decode: " + why);
}

}  // namespace

DecodeSlots add_decode_slots(Runtime& runtime) {
  DecodeSlots s;
  s.paged_attention = runtime.add_slot(kPagedAttention);
  s.paged_kv_append = runtime.add_slot(kPagedKVAppend);
  return s;
}

KvCacheShape kv_cache_shape(const ModelConfig& config, const DecodeConfig& decode) {
  if (decode.max_batch < 1)
    invalid(fmt::format("max_batch is {}; decode at least 1 sequence", decode.max_batch));
  if (decode.page_size < 1)
    invalid(fmt::format("page_size is {}; pages hold at least 1 token (64 by default)",
                        decode.page_size));
  const int64_t context = decode.max_context == 0 ? config.seq : decode.max_context;
  if (context < 1 || context > config.seq)
    invalid(
        fmt::format("max_context is {}; model {} holds 1..{} tokens per sequence (its rotary "
                    "table)",
                    context, config.name, config.seq));
  KvCacheShape c;
  c.max_context = context;
  c.page_size = decode.page_size;
  c.pages_per_sequence = (context + decode.page_size - 1) / decode.page_size;
  c.pages = c.pages_per_sequence * decode.max_batch;
  c.kv_heads = config.kv_heads;
  c.head_dim = config.head_dim;
  c.layers = config.layers;
  return c;
}

// ---- the decode kernels ---------------------------------------------------------------------

std::vector<std::string> decode_kernel_names() {
  std::vector<std::string> names;
  for (const char* base : {"kh_paged_append", "kh_paged_decode", "kh_argmax_advance"})
    for (const char* suffix : {"_f32", "_bf16"}) names.push_back(std::string(base) + suffix);
  names.push_back("kh_step_advance");
  return names;
}

DecodeKernels::DecodeKernels(int device)
    : module_(device, "demo_device_decode", device_decode_source()) {
  for (const std::string& name : decode_kernel_names()) module_.function(name);  // fail early
}

kh_device_function_t* DecodeKernels::typed(const std::string& base, const DeviceTensor& t) {
  if (!same_dtype(t.dtype(), kF32) && !same_dtype(t.dtype(), kBF16))
    invalid(fmt::format("{}: {} is neither float32 nor bfloat16", base, t.describe()));
  return module_.function(base + (same_dtype(t.dtype(), kBF16) ? "_bf16" : "_f32"));
}

void DecodeKernels::append(DeviceStream& s, const DeviceTensor& k_new, const DeviceTensor& v_new,
                           const DeviceTensor& block_table, const DeviceTensor& seq_lens,
                           DeviceTensor& k_cache, DeviceTensor& v_cache) {
  if (k_new.ndim() != 4 || k_new.shape() != v_new.shape() || k_cache.ndim() != 4 ||
      k_cache.shape() != v_cache.shape() || k_new.dim(2) != k_cache.dim(2) ||
      k_new.dim(3) != k_cache.dim(3) || !same_dtype(k_new.dtype(), k_cache.dtype()))
    invalid(fmt::format("append: k_new {} / v_new {} do not fit the cache {} / {}",
                        k_new.describe(), v_new.describe(), k_cache.describe(),
                        v_cache.describe()));
  const void *kn = k_new.data(), *vn = v_new.data(), *bt = block_table.data(),
             *sl = seq_lens.data();
  void *kc = k_cache.data(), *vc = v_cache.data();
  int n_new = static_cast<int>(k_new.dim(1)), kv_heads = static_cast<int>(k_new.dim(2)),
      head_dim = static_cast<int>(k_new.dim(3)),
      table_stride = static_cast<int>(block_table.dim(1)),
      page_size = static_cast<int>(k_cache.dim(1));
  void* args[] = {&kn,    &vn,       &bt,       &sl,           &kc,       &vc,
                  &n_new, &kv_heads, &head_dim, &table_stride, &page_size};
  const auto rows = static_cast<uint32_t>(k_new.dim(0) * k_new.dim(1));
  if (rows == 0) return;
  launch(typed("kh_paged_append", k_new),
         launch_cfg(s.device(), {rows, static_cast<uint32_t>(kv_heads), 1}, {kThreads, 1, 1}), args,
         s);
}

void DecodeKernels::attend(DeviceStream& s, const DeviceTensor& q, const DeviceTensor& k_cache,
                           const DeviceTensor& v_cache, const DeviceTensor& block_table,
                           const DeviceTensor& seq_lens, float scale, DeviceTensor& out) {
  if (q.ndim() != 4 || q.dim(1) != 1 || out.shape() != q.shape() || q.dim(3) != k_cache.dim(3) ||
      q.dim(2) % k_cache.dim(2) != 0 || !same_dtype(q.dtype(), k_cache.dtype()))
    invalid(
        fmt::format("attend: q {} / out {} do not fit the cache {} (one query token per "
                    "sequence, GQA, one dtype)",
                    q.describe(), out.describe(), k_cache.describe()));
  const int64_t max_context = block_table.dim(1) * k_cache.dim(1);
  const int head_dim = static_cast<int>(q.dim(3));
  const uint64_t shared = static_cast<uint64_t>(head_dim + 32 + max_context) * sizeof(float);
  if (shared > 48 * 1024)
    invalid(
        fmt::format("attend: the runtime's own decode kernel keeps the scores of {} tokens "
                    "in shared memory (at most ~12000); bind the attention package's "
                    "PagedAttention for longer contexts",
                    max_context));
  const void *qp = q.data(), *kc = k_cache.data(), *vc = v_cache.data(), *bt = block_table.data(),
             *sl = seq_lens.data();
  void* op = out.data();
  int q_heads = static_cast<int>(q.dim(2)), kv_heads = static_cast<int>(k_cache.dim(2)),
      hd = head_dim, table_stride = static_cast<int>(block_table.dim(1)),
      page_size = static_cast<int>(k_cache.dim(1));
  float sc = scale;
  void* args[] = {&qp,      &kc,       &vc, &bt,           &sl,        &op,
                  &q_heads, &kv_heads, &hd, &table_stride, &page_size, &sc};
  launch(
      typed("kh_paged_decode", q),
      launch_cfg(s.device(), {static_cast<uint32_t>(q_heads), static_cast<uint32_t>(q.dim(0)), 1},
                 {kThreads, 1, 1}, static_cast<uint32_t>(shared)),
      args, s);
}

void DecodeKernels::argmax_advance(DeviceStream& s, const DeviceTensor& logits, int64_t offset,
                                   int64_t row_stride, int64_t batch, int64_t vocab,
                                   DeviceTensor& tokens, DeviceTensor& positions,
                                   DeviceTensor& seq_lens, DeviceTensor& out_tokens,
                                   DeviceTensor& step) {
  if (offset + (batch - 1) * row_stride + vocab > logits.numel())
    invalid(fmt::format("argmax: {} rows of {} at stride {} from {} exceed the logits {}", batch,
                        vocab, row_stride, offset, logits.describe()));
  const size_t elem = same_dtype(logits.dtype(), kBF16) ? 2 : 4;
  const void* lp = static_cast<const char*>(logits.data()) + offset * static_cast<int64_t>(elem);
  long long stride = row_stride, v = vocab;
  void *tp = tokens.data(), *pp = positions.data(), *sp = seq_lens.data(), *op = out_tokens.data(),
       *st = step.data();
  int cols = static_cast<int>(out_tokens.dim(1));
  void* args[] = {&lp, &stride, &v, &tp, &pp, &sp, &op, &st, &cols};
  launch(typed("kh_argmax_advance", logits),
         launch_cfg(s.device(), {static_cast<uint32_t>(batch), 1, 1}, {256, 1, 1}), args, s);
  void* step_args[] = {&st};
  launch(module_.function("kh_step_advance"), launch_cfg(s.device(), {1, 1, 1}, {32, 1, 1}),
         step_args, s);
}

// ---- DeviceCausalLM's decode ------------------------------------------------------------------

struct DeviceCausalLM::DecodeState {
  DecodeState(int device, const KvCacheShape& c)
      : kernels(device),
        shape(c),
        branch_k(device),
        branch_v(device),
        fork(device),
        joined_k(device),
        joined_v(device) {}

  DecodeKernels kernels;
  KvCacheShape shape;
  // The k and v projections (with k's norm) run beside q's on two more streams, forked from and
  // joined into the model's stream by events: three short chains instead of one of five kernels
  // (a decode step is bound by its kernels' latency, not by their work).
  DeviceStream branch_k, branch_v;
  DeviceEvent fork, joined_k, joined_v;
  Runtime* runtime = nullptr;  // the model's runtime, for set_capturing
  std::optional<DecodeSlots> slots;
  bool package = false;  // PagedKVAppend and PagedAttention bound: a bfloat16 cache
  DLDataType act{};      // the activations' dtype
  std::vector<DeviceTensor> k_cache, v_cache;  // per layer, [pages, page_size, kv_heads, head_dim]

  // The prefilled batch (`batch` sequences of `len` prompt tokens) and what is sized for it:
  // int32 block_table [batch, pages_per_sequence] (sequence b owns pages b * pages_per_sequence
  // ...), int32 seq_lens, int64 positions and tokens [batch], int64 out_tokens [batch,
  // max_context] and int32 step [1]; the step's activations (`buffers_batch` rows): nothing is
  // allocated while a step is captured.
  int batch = 0, len = 0, buffers_batch = 0;
  DeviceTensor block_table, seq_lens, positions, tokens, out_tokens, step;
  DeviceTensor h, a, q, k, v, q_pre, k_pre, attn, branch, m, gu, s, f, logits, workspace;
  DeviceTensor q16, k16, v16, o16;   // bf16 copies at the package boundary (fp32 activations)
  std::optional<DeviceGraph> graph;  // the step captured for buffers_batch
  double decode_ms = 0;
  int decode_steps = 0;
};

namespace {

// x in bfloat16: x itself, or x cast into `scratch` (allocated only when it has another shape,
// so a captured step, whose scratch is sized beforehand, allocates nothing).
DeviceTensor bf16_of(DeviceKernels& kernels, DeviceStream& stream, DevicePool& pool,
                     const DeviceTensor& x, DeviceTensor& scratch) {
  if (same_dtype(x.dtype(), kBF16)) return x.view(x.shape());
  if (scratch.shape() != x.shape() || !same_dtype(scratch.dtype(), kBF16))
    scratch = DeviceTensor(pool, x.shape(), kBF16);
  kernels.cast(stream, x, scratch);
  return scratch.view(x.shape());
}

}  // namespace

void DeviceCausalLM::DecodeStateDelete::operator()(DecodeState* d) const {
  delete d;
}

void DeviceCausalLM::init_decode(Runtime& runtime, const DecodeConfig& config) {
  if (&runtime != &runtime_)
    invalid("init_decode needs the runtime the model was built with (its table serves the slots)");
  const KvCacheShape shape = kv_cache_shape(cfg_, config);
  decode_.reset();
  std::unique_ptr<DecodeState, DecodeStateDelete> d(new DecodeState(device_, shape));
  d->runtime = &runtime;
  const auto attn = runtime.find_slot(kPagedAttention);
  const auto append = runtime.find_slot(kPagedKVAppend);
  if (attn && append) d->slots = DecodeSlots{*attn, *append};
  d->act = act_;  // the model's activations (bf16 with fp32 master weights, or fp32)
  // Package or the runtime's kernels, decided once: the cache's dtype depends on it.
  d->package = d->slots &&
               runtime.slot_binding(d->slots->paged_attention, device_, Mode::kEval).bound &&
               runtime.slot_binding(d->slots->paged_kv_append, device_, Mode::kEval).bound;
  const DLDataType cache = d->package ? kBF16 : d->act;
  for (int l = 0; l < cfg_.layers; ++l) {
    d->k_cache.push_back(
        empty({shape.pages, shape.page_size, shape.kv_heads, shape.head_dim}, cache));
    d->v_cache.push_back(
        empty({shape.pages, shape.page_size, shape.kv_heads, shape.head_dim}, cache));
  }
  decode_ = std::move(d);
}

bool DeviceCausalLM::decode_graph_captured() const {
  return decode_ && decode_->graph.has_value();
}

double DeviceCausalLM::last_decode_ms() const {
  return decode_ ? decode_->decode_ms : 0;
}

int DeviceCausalLM::last_decode_steps() const {
  return decode_ ? decode_->decode_steps : 0;
}

bool DeviceCausalLM::decode_uses_package() const {
  return decode_ && decode_->package;
}

void DeviceCausalLM::prefill(const int64_t* prompts, int batch, int len, Logits logits) {
  if (!decode_) invalid("prefill before init_decode: size the KV cache first");
  DecodeState& d = *decode_;
  if (runtime_.mode() != Mode::kEval)
    invalid("prefill and decode run in eval mode; set_mode(eval) first");
  if (batch < 1 || batch > d.shape.pages / d.shape.pages_per_sequence)
    invalid(fmt::format("a batch of {} sequences; the cache holds 1..{}", batch,
                        d.shape.pages / d.shape.pages_per_sequence));
  if (len < 1 || len > d.shape.max_context)
    invalid(fmt::format("prompts of {} tokens; the cache holds 1..{} per sequence", len,
                        d.shape.max_context));
  const int64_t B = batch, H = cfg_.hidden, Q = cfg_.q_dim(), KV = cfg_.kv_dim(), F = cfg_.ffn;
  const int64_t V = cfg_.vocab;
  const DLDataType i32{kDLInt, 32, 1};
  if (d.buffers_batch != batch) {  // a new batch: its buffers, and a new graph
    d.graph.reset();
    const int64_t PP = d.shape.pages_per_sequence;
    std::vector<int32_t> table(static_cast<size_t>(B * PP));
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    d.block_table = empty({B, PP}, i32);
    d.block_table.upload(stream_, table.data(), table.size() * sizeof(int32_t));
    d.seq_lens = empty({B}, i32);
    d.positions = empty({B}, kI64);
    d.tokens = empty({B}, kI64);
    d.out_tokens = empty({B, d.shape.max_context}, kI64);
    d.step = empty({1}, i32);
    const DLDataType t = d.act;
    d.h = empty({B, H}, t);
    d.a = empty({B, H}, t);
    d.q = empty({B, Q}, t);
    d.k = empty({B, KV}, t);
    d.v = empty({B, KV}, t);
    if (cfg_.qk_norm) {
      d.q_pre = empty({B, Q}, t);
      d.k_pre = empty({B, KV}, t);
    }
    d.attn = empty({B, Q}, t);
    d.branch = empty({B, H}, t);
    d.m = empty({B, H}, t);
    d.gu = empty({B, 2 * F}, t);
    d.s = empty({B, F}, t);
    d.f = empty({B, H}, t);
    d.logits = empty({B, V}, t);
    if (d.package) {
      const int64_t NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
      d.workspace = empty({B * NH * kDecodeSplits * (HD + 2)}, kF32);
      if (!same_dtype(t, kBF16)) {
        d.q16 = empty({B, 1, NH, HD}, kBF16);
        d.o16 = empty({B, 1, NH, HD}, kBF16);
        d.k16 = empty({B, 1, NKV, HD}, kBF16);
        d.v16 = empty({B, 1, NKV, HD}, kBF16);
      }
    }
    d.buffers_batch = batch;
    stream_.synchronize();  // `table` is pageable and local
  }
  // The prompt's K/V are the last `len` tokens of seq_lens; the greedy step after the prompt
  // then advances positions from len - 1 and seq_lens from len.
  const std::vector<int32_t> lens(static_cast<size_t>(B), len);
  const std::vector<int64_t> last(static_cast<size_t>(B), len - 1);
  const int32_t zero = 0;
  d.seq_lens.upload(stream_, lens.data(), lens.size() * sizeof(int32_t));
  d.positions.upload(stream_, last.data(), last.size() * sizeof(int64_t));
  d.step.upload(stream_, &zero, sizeof zero);
  d.batch = batch;
  d.len = len;
  prefilling_kv_ = true;
  try {
    forward(prompts, nullptr, batch, len, logits);  // synchronizes
  } catch (...) {
    prefilling_kv_ = false;
    throw;
  }
  prefilling_kv_ = false;
  const bool all = logits == Logits::kAll;  // each sequence's last row: its first token
  d.kernels.argmax_advance(stream_, logits_, all ? (len - 1) * V : 0, all ? len * V : V, B, V,
                           d.tokens, d.positions, d.seq_lens, d.out_tokens, d.step);
  stream_.synchronize();
}

// K and V of the prompt ([batch * len, kv_dim] after RoPE) into the cache, for layer_forward.
void DeviceCausalLM::prefill_kv(const Layer& L, const Saved& s) {
  const auto layer = static_cast<size_t>(&L - layers_.data());
  const int64_t B = decode_->batch, S = decode_->len, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  decode_append(layer, s.k.view({B, S, NKV, HD}), s.v.view({B, S, NKV, HD}));
}

void DeviceCausalLM::decode_append(size_t layer, const DeviceTensor& k4, const DeviceTensor& v4) {
  DecodeState& d = *decode_;
  DeviceTensor& kc = d.k_cache[layer];
  DeviceTensor& vc = d.v_cache[layer];
  if (!d.package) {
    d.kernels.append(stream_, k4, v4, d.block_table, d.seq_lens, kc, vc);
    return;
  }
  // The step's scratch is sized for one token per sequence; a prompt gets its own.
  DeviceTensor prompt_k, prompt_v;
  const bool step = k4.shape() == d.k16.shape();
  DeviceTensor kb = bf16_of(kernels_, stream_, pool_, k4, step ? d.k16 : prompt_k);
  DeviceTensor vb = bf16_of(kernels_, stream_, pool_, v4, step ? d.v16 : prompt_v);
  if (bound(d.slots->paged_kv_append) &&
      call_slot(d.slots->paged_kv_append, kPagedKVAppend, false,
                {tensor_arg(&kb), tensor_arg(&vb), tensor_arg(&d.block_table),
                 tensor_arg(&d.seq_lens), tensor_arg(&kc), tensor_arg(&vc)}))
    return;
  // The package refused this model (a head_dim its kernels lack): the runtime's kernel on the
  // package's bf16 cache, from here on (refusals()).
  d.kernels.append(stream_, kb, vb, d.block_table, d.seq_lens, kc, vc);
}

void DeviceCausalLM::decode_attend(size_t layer, const DeviceTensor& q4, DeviceTensor& out4) {
  DecodeState& d = *decode_;
  const DeviceTensor& kc = d.k_cache[layer];
  const DeviceTensor& vc = d.v_cache[layer];
  if (!d.package) {
    d.kernels.attend(stream_, q4, kc, vc, d.block_table, d.seq_lens, attention_scale(), out4);
    return;
  }
  DeviceTensor qb = bf16_of(kernels_, stream_, pool_, q4, d.q16);
  const bool cast_out = !same_dtype(out4.dtype(), kBF16);
  DeviceTensor ob = cast_out ? d.o16.view(out4.shape()) : out4.view(out4.shape());
  if (!bound(d.slots->paged_attention) ||
      !call_slot(d.slots->paged_attention, kPagedAttention, false,
                 {tensor_arg(&qb), tensor_arg(&kc), tensor_arg(&vc), tensor_arg(&d.block_table),
                  tensor_arg(&d.seq_lens), int_arg(-1), float_arg(attention_scale()),
                  tensor_arg(&ob), tensor_arg(&d.workspace)}))
    d.kernels.attend(stream_, qb, kc, vc, d.block_table, d.seq_lens, attention_scale(), ob);
  if (cast_out) kernels_.cast(stream_, ob, out4);
}

// body() on `branch` after the work the model's stream has before decode_->fork, then `joined`
// recorded there: the model's members that take stream_ (linear, norm, the slot calls) enqueue
// on the branch while it is swapped in.
template <typename F>
void DeviceCausalLM::on_branch(DeviceStream& branch, DeviceEvent& joined, F&& body) {
  branch.wait(decode_->fork);
  std::swap(stream_, branch);
  try {
    body();
  } catch (...) {
    std::swap(stream_, branch);
    throw;
  }
  std::swap(stream_, branch);
  joined.record(branch);
}

// One token per sequence through the layers, on the step's buffers (the host model's
// layer_forward for a single position, reading the cache for attention), ending with the greedy
// argmax that feeds the next step. Allocates nothing: it is what the graph captures.
void DeviceCausalLM::decode_launch() {
  DecodeState& d = *decode_;
  const int64_t B = d.batch, NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  const int64_t V = cfg_.vocab;
  kernels_.embedding_forward(stream_, run(*emb_), d.tokens, d.h);
  // The residual stream is d.h + the last MLP's d.branch: each pre-norm adds it in place (eval:
  // add_norm allocates nothing), in one FusedAddRMSNorm pass when the package serves it.
  const DeviceTensor none;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& L = layers_[l];
    add_norm(l == 0 ? none : d.branch, d.h.view(d.h.shape()), *L.attn_norm, d.a, nullptr);
    d.fork.record(stream_);
    on_branch(d.branch_v, d.joined_v, [&] { linear(d.a, *L.wv, L.bv, d.v); });
    DeviceTensor q3 = d.q.view({B, NH, HD}), k3 = d.k.view({B, NKV, HD});
    bool rotated = false;
    if (L.q_norm && bound(slots_.qk_norm_rotary)) {
      // Qwen3: q and k projected into place, then their norms and RoPE in one pass.
      on_branch(d.branch_k, d.joined_k, [&] { linear(d.a, *L.wk, L.bk, d.k); });
      linear(d.a, *L.wq, L.bq, d.q);
      stream_.wait(d.joined_k);
      rotated = call_slot(slots_.qk_norm_rotary, kQKNormRotaryEmbedding, false,
                          {tensor_arg(&d.positions), tensor_arg(&q3), tensor_arg(&k3),
                           tensor_arg(&run(*L.q_norm)), tensor_arg(&run(*L.k_norm)),
                           float_arg(cfg_.eps), tensor_arg(&cos_), tensor_arg(&sin_), int_arg(1)});
      if (!rotated) {  // refused (nothing written): the composition below, from q_pre and k_pre
        stream_.copy(d.q_pre.data(), d.q.data(), d.q.bytes(), KH_COPY_D2D);
        stream_.copy(d.k_pre.data(), d.k.data(), d.k.bytes(), KH_COPY_D2D);
        DeviceTensor qn = d.q.view({B * NH, HD}), kn = d.k.view({B * NKV, HD});
        norm(d.q_pre.view({B * NH, HD}), *L.q_norm, qn, nullptr);
        norm(d.k_pre.view({B * NKV, HD}), *L.k_norm, kn, nullptr);
      }
    } else if (L.q_norm) {
      on_branch(d.branch_k, d.joined_k, [&] {
        linear(d.a, *L.wk, L.bk, d.k_pre);
        DeviceTensor kn = d.k.view({B * NKV, HD});
        norm(d.k_pre.view({B * NKV, HD}), *L.k_norm, kn, nullptr);
      });
      linear(d.a, *L.wq, L.bq, d.q_pre);
      DeviceTensor qn = d.q.view({B * NH, HD});
      norm(d.q_pre.view({B * NH, HD}), *L.q_norm, qn, nullptr);
    } else {
      on_branch(d.branch_k, d.joined_k, [&] { linear(d.a, *L.wk, L.bk, d.k); });
      linear(d.a, *L.wq, L.bq, d.q);
    }
    stream_.wait(d.joined_k);
    stream_.wait(d.joined_v);
    if (!rotated && bound(slots_.rotary))
      call_slot(slots_.rotary, kRotaryEmbedding, false,
                {tensor_arg(&d.positions), tensor_arg(&q3), tensor_arg(&k3), tensor_arg(&cos_),
                 tensor_arg(&sin_), int_arg(1)});
    else if (!rotated)
      kernels_.rotary(stream_, d.positions, q3, &k3, cos_, sin_, /*neox=*/true, false);
    decode_append(l, d.k.view({B, 1, NKV, HD}), d.v.view({B, 1, NKV, HD}));
    DeviceTensor o4 = d.attn.view({B, 1, NH, HD});
    decode_attend(l, d.q.view({B, 1, NH, HD}), o4);
    linear(d.attn, *L.wo, L.bo, d.branch);
    add_norm(d.branch, d.h.view(d.h.shape()), *L.mlp_norm, d.m, nullptr);
    linear(d.m, *L.gate_up, nullptr, d.gu);
    if (bound(slots_.silu_and_mul))
      call_slot(slots_.silu_and_mul, kSiluAndMul, false, {tensor_arg(&d.gu), tensor_arg(&d.s)});
    else
      kernels_.silu_and_mul(stream_, d.gu, d.s);
    linear(d.s, *L.wdown, nullptr, d.branch);
  }
  add_norm(d.branch, d.h.view(d.h.shape()), *final_norm_, d.f, nullptr);
  linear(d.f, *head_, nullptr, d.logits);
  d.kernels.argmax_advance(stream_, d.logits, 0, V, B, V, d.tokens, d.positions, d.seq_lens,
                           d.out_tokens, d.step);
}

void DeviceCausalLM::decode_step(const int64_t* tokens, bool graph) {
  if (!decode_ || decode_->batch == 0) invalid("decode_step before prefill");
  DecodeState& d = *decode_;
  if (runtime_.mode() != Mode::kEval)
    invalid("prefill and decode run in eval mode; set_mode(eval) first");
  const int64_t B = d.batch;
  if (tokens) {
    for (int64_t b = 0; b < B; ++b)
      if (tokens[b] < 0 || tokens[b] >= cfg_.vocab)
        invalid(fmt::format("token {} of sequence {} is outside the vocabulary (0..{})", tokens[b],
                            b, cfg_.vocab - 1));
    d.tokens.upload(stream_, tokens, static_cast<size_t>(B) * sizeof(int64_t));
  }
  if (!graph) {
    decode_launch();
  } else if (d.graph) {
    d.graph->launch(stream_);
  } else {
    decode_launch();  // eager first: every op's code is loaded before the capture
    // A bound op must declare that it may run inside a capture.
    for (uint32_t slot : {slots_.rms_norm, slots_.fused_add_rms_norm, slots_.rotary,
                          slots_.qk_norm_rotary, slots_.silu_and_mul}) {
      if (!bound(slot)) continue;
      const SlotBinding b = runtime_.slot_binding(slot, device_, Mode::kEval);
      if (!(b.flags & KH_FLAG_GRAPH_SAFE))
        throw Error(ErrorKind::kRefused,
                    fmt::format("decode graph: slot {} is served by {} {} ({}), which does not "
                                "declare KH_FLAG_GRAPH_SAFE; decode without a graph, or bind a "
                                "graph-safe package",
                                b.slot, b.package, b.version, b.layer));
    }
    if (d.package)
      for (uint32_t slot : {d.slots->paged_attention, d.slots->paged_kv_append}) {
        const SlotBinding b = runtime_.slot_binding(slot, device_, Mode::kEval);
        if (!(b.flags & KH_FLAG_GRAPH_SAFE))
          throw Error(ErrorKind::kRefused,
                      fmt::format("decode graph: slot {} is served by {} {} ({}), which does "
                                  "not declare KH_FLAG_GRAPH_SAFE; decode without a graph",
                                  b.slot, b.package, b.version, b.layer));
      }
    d.runtime->set_capturing(true);
    stream_.begin_capture();
    try {
      decode_launch();
    } catch (...) {
      try {
        DeviceGraph::end_capture(stream_);  // ends the stream's capture; the graph is dropped
      } catch (const Error&) {
      }
      d.runtime->set_capturing(false);
      throw;
    }
    d.graph.emplace(DeviceGraph::end_capture(stream_));
    d.runtime->set_capturing(false);
  }
  if (tokens) stream_.synchronize();  // the host tokens are pageable
}

std::vector<float> DeviceCausalLM::download_decode_logits() {
  if (!decode_ || !decode_->logits.data()) invalid("no decode step has run");
  DeviceTensor& l = decode_->logits;
  std::vector<float> host(static_cast<size_t>(l.numel()));
  if (same_dtype(l.dtype(), kF32)) {
    l.download(stream_, host.data(), host.size() * sizeof(float));
  } else {
    DeviceTensor f = empty(l.shape(), kF32);
    kernels_.cast(stream_, l, f);
    f.download(stream_, host.data(), host.size() * sizeof(float));
  }
  stream_.synchronize();
  return host;
}

std::vector<int64_t> DeviceCausalLM::generate(const int64_t* prompts, int batch, int len, int n,
                                              bool graph) {
  if (!decode_) invalid("generate before init_decode: size the KV cache first");
  if (n < 1) invalid(fmt::format("generate {} tokens; at least 1", n));
  if (static_cast<int64_t>(len) + n - 1 > decode_->shape.max_context)
    invalid(
        fmt::format("{} prompt tokens + {} generated need {} cache positions; the cache "
                    "holds {} per sequence",
                    len, n, len + n - 1, decode_->shape.max_context));
  prefill(prompts, batch, len, Logits::kLast);  // the first token
  DecodeState& d = *decode_;
  // The first decode step (eager, and the capture when graph) is not timed: the others are the
  // steady state, each a graph replay or an eager step.
  if (n > 1) decode_step(nullptr, graph);
  DeviceEvent start(device_), stop(device_);
  start.record(stream_);
  for (int i = 2; i < n; ++i) decode_step(nullptr, graph);
  stop.record(stream_);
  stop.synchronize();
  d.decode_ms = stop.elapsed_ms_since(start);
  d.decode_steps = std::max(0, n - 2);
  std::vector<int64_t> all(static_cast<size_t>(d.out_tokens.numel()));
  d.out_tokens.download(stream_, all.data(), all.size() * sizeof(int64_t));
  stream_.synchronize();
  std::vector<int64_t> out;
  const auto cols = static_cast<size_t>(d.shape.max_context);
  for (size_t b = 0; b < static_cast<size_t>(batch); ++b)
    out.insert(out.end(), all.begin() + static_cast<ptrdiff_t>(b * cols),
               all.begin() + static_cast<ptrdiff_t>(b * cols + static_cast<size_t>(n)));
  return out;
}

}  // namespace kh::demo
