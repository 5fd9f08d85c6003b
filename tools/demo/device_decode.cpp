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
#include "tools/demo/skinny_gemm.h"

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
  s.attention_with_append = runtime.add_slot(kPagedAttentionWithKVAppend);
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
  return names;
}

DecodeKernels::DecodeKernels(int device)
    : module_(device, "demo_device_decode", device_decode_source()),
      multiprocessors_(std::max(1, device_info(device).multiprocessors)) {
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
                                   DeviceTensor& step, DeviceTensor& scratch) {
  if (batch < 1 || vocab < 1 || vocab >= 0xFFFFFFFFll)
    invalid(
        fmt::format("argmax: {} rows of {} logits; need at least one of each, and fewer than "
                    "2^32 - 1 logits a row",
                    batch, vocab));
  if (offset + (batch - 1) * row_stride + vocab > logits.numel())
    invalid(fmt::format("argmax: {} rows of {} at stride {} from {} exceed the logits {}", batch,
                        vocab, row_stride, offset, logits.describe()));
  if (!same_dtype(scratch.dtype(), kI64) || scratch.numel() < argmax_scratch_elems(batch))
    invalid(fmt::format("argmax: scratch {} must be int64 of at least {} elements (zeroed)",
                        scratch.describe(), argmax_scratch_elems(batch)));
  const size_t elem = same_dtype(logits.dtype(), kBF16) ? 2 : 4;
  const void* lp = static_cast<const char*>(logits.data()) + offset * static_cast<int64_t>(elem);
  long long stride = row_stride, v = vocab;
  void *tp = tokens.data(), *pp = positions.data(), *sp = seq_lens.data(), *op = out_tokens.data(),
       *st = step.data(), *sc = scratch.data();
  int cols = static_cast<int>(out_tokens.dim(1));
  void* args[] = {&lp, &stride, &v, &tp, &pp, &sp, &op, &st, &cols, &sc};
  // One wave: a CTA of 1024 threads an SM (its registers fill the SM's file) over all rows,
  // each CTA at least one 16-byte vector a thread.
  const int64_t vectors = vocab * static_cast<int64_t>(elem) / 16 + 1;
  const int64_t splits = std::clamp<int64_t>(
      std::min(multiprocessors_ / batch, (vectors + kArgmaxThreads - 1) / kArgmaxThreads), 1, 1024);
  launch(typed("kh_argmax_advance", logits),
         launch_cfg(s.device(), {static_cast<uint32_t>(splits), static_cast<uint32_t>(batch), 1},
                    {kArgmaxThreads, 1, 1}),
         args, s);
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
        joined_v(device),
        second_half(device),
        halves_fork(device),
        halves_joined(device),
        attended{DeviceEvent(device), DeviceEvent(device)} {}

  DecodeKernels kernels;
  KvCacheShape shape;
  // The k and v projections (with k's norm) run beside q's on two more streams, forked from and
  // joined into the model's stream by events: three short chains instead of one of five kernels
  // (a decode step is bound by its kernels' latency, not by their work).
  DeviceStream branch_k, branch_v;
  DeviceEvent fork, joined_k, joined_v;
  // Two-batch overlap (DecodeOverlap): the second half's layers on their own stream; each
  // half's attention waits for the other's last one (attended[0] and [1]: the halves' last).
  DeviceStream second_half;
  DeviceEvent halves_fork, halves_joined;
  DeviceEvent attended[2];
  DecodeOverlap overlap_mode = DecodeOverlap::kOff;
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
  DeviceTensor argmax_scratch;  // DecodeKernels::argmax_advance's, zeroed
  DeviceTensor h, a, q, k, v, q_pre, k_pre, attn, branch, m, gu, s, f, logits, workspace;
  DeviceTensor q16, k16, v16, o16;  // bf16 copies at the package boundary (fp32 activations)
  DeviceTensor qkv;  // [batch, q_dim + 2 kv_dim]: the fused projection's rows (Layer::qkv)
  std::optional<DeviceGraph> graph;  // the step captured for buffers_batch
  DecodeGemm gemm = DecodeGemm::kAuto;
  std::optional<SkinnyGemm> skinny;  // kSkinny, or kAuto on Hopper, on a bf16 model
  int skinny_gemms = 0;              // the last step's GEMMs on it
  int gemms = 0;                     // the last step's GEMMs
  DecodeFuse fuse = DecodeFuse::kOn;
  bool fused_qkv = false;      // the last step's layers all took decode_fused_qkv
  bool fused_append = false;   // ... and appended K/V in their attention's launch
  bool fused_qk_norm = false;  // ... and normed and rotated q and k in the q/k/v GEMM
  bool fused_silu = false;     // the last step's MLPs all took SiluAndMul in the gate/up GEMM
  bool fused_norm = false;     // ... and every norm between projections was folded into them
  bool fused_head = false;     // the LM head and the greedy argmax ran as one GEMM (its epilogue)
  bool fused_final_norm = false;  // ... with the final norm folded into it too
  // The folded norm (folds_norm()): the last residual-epilogue GEMM has added its output into h
  // and left the rows' sums of squares, a partial per 64-column tile of h, in norm_ss (fp32
  // [tiles, 64]).
  DeviceTensor norm_ss;
  bool residual_in_h = false;
  // The consumers' weights with the norm's weight folded in (W diag(w): SkinnyPrenorm), per layer:
  // q/k/v (Layer::qkv, else empty) after the attention norm, gate/up after the MLP norm; folded
  // at adam step normed_at (fold_norm_weights), before the step that uses them.
  std::vector<DeviceTensor> qkv_normed, gate_up_normed;
  int64_t normed_at = -1;
  double decode_ms = 0;
  int decode_steps = 0;

  DecodeRows rows(int64_t begin, int64_t count) const;
  // Whether the step may fold a layer into a skinny GEMM's epilogue (DecodeFuse::kOn and the
  // skinny GEMM in use); the epilogue's refusal still decides for each call.
  bool folds() const { return fuse == DecodeFuse::kOn && gemm != DecodeGemm::kCublasLt && skinny; }
  // Whether the norms between projections may fold into them: one norm_ss, so not while the
  // halves' layers run on two streams.
  bool folds_norm() const { return folds() && !overlapped(); }
  // Whether decode_linear runs x . W^T -> y on the skinny GEMM: where it takes the shapes and
  // (kAuto) where it is preferred.
  bool skinny_takes(const DeviceTensor& x, const DeviceTensor& W, const DeviceTensor& y) const {
    return skinny && skinny->fits(x, W, y) &&
           (gemm == DecodeGemm::kSkinny ||
            skinny_preferred(x.numel() / W.dim(1), W.dim(0), W.dim(1), skinny->has_wgmma()));
  }
  // The folded norm's operand, after an o or down projection's run_residual.
  SkinnyPrenorm prenorm(float eps) const {
    return {&norm_ss, static_cast<int>(norm_ss.dim(0)), eps};
  }
  // Whether the prefilled batch's steps run as two halves.
  bool overlapped() const { return overlap_mode == DecodeOverlap::kOn && batch >= 2; }
};

// The step's buffers for rows [begin, begin + count) of the batch: row views of DecodeState's
// (the same memory), for the whole batch or one half of it. The attention of a half waits for
// `after` (the other half's last attention) and then records `done`; both null for the batch.
struct DeviceCausalLM::DecodeRows {
  int64_t batch = 0;
  DeviceTensor h, a, q, k, v, q_pre, k_pre, qkv, attn, branch, m, gu, s;
  DeviceTensor q16, k16, v16, o16;  // allocated for fp32 activations only
  DeviceTensor positions, seq_lens, block_table, workspace;
  DeviceEvent* after = nullptr;
  DeviceEvent* done = nullptr;
};

DeviceCausalLM::DecodeRows DeviceCausalLM::DecodeState::rows(int64_t begin, int64_t count) const {
  auto part = [&](const DeviceTensor& t) {
    return t.data() ? t.rows(begin, count) : DeviceTensor{};
  };
  DecodeRows r;
  r.batch = count;
  for (auto [to, from] : {std::pair{&r.h, &h},
                          {&r.a, &a},
                          {&r.q, &q},
                          {&r.k, &k},
                          {&r.v, &v},
                          {&r.q_pre, &q_pre},
                          {&r.k_pre, &k_pre},
                          {&r.qkv, &qkv},
                          {&r.attn, &attn},
                          {&r.branch, &branch},
                          {&r.m, &m},
                          {&r.gu, &gu},
                          {&r.s, &s},
                          {&r.q16, &q16},
                          {&r.k16, &k16},
                          {&r.v16, &v16},
                          {&r.o16, &o16},
                          {&r.positions, &positions},
                          {&r.seq_lens, &seq_lens},
                          {&r.block_table, &block_table}})
    *to = part(*from);
  if (workspace.data()) {  // the attention's scratch is per sequence
    const int64_t per = workspace.numel() / batch;
    r.workspace = workspace.rows(begin * per, count * per);
  }
  return r;
}

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
  d->overlap_mode = config.overlap;
  d->gemm = config.gemm;
  d->fuse = config.fuse;
  // kAuto builds the skinny GEMM only where skinny_preferred() can pick it (wgmma: sm_90).
  if (bf16_ && (config.gemm == DecodeGemm::kSkinny ||
                (config.gemm == DecodeGemm::kAuto && device_info(device_).sm_major == 9)))
    d->skinny.emplace(device_, pool_);
  const auto attn = runtime.find_slot(kPagedAttention);
  const auto append = runtime.find_slot(kPagedKVAppend);
  if (attn && append)
    d->slots = DecodeSlots{*attn, *append, runtime.find_slot(kPagedAttentionWithKVAppend)};
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

bool DeviceCausalLM::decode_fuses_qkv() const {
  return decode_ && decode_->fused_qkv;
}

bool DeviceCausalLM::decode_fuses_append() const {
  return decode_ && decode_->fused_qkv && decode_->fused_append;
}

bool DeviceCausalLM::decode_fuses_silu() const {
  return decode_ && decode_->fused_silu;
}

bool DeviceCausalLM::decode_fuses_qk_norm() const {
  return decode_ && decode_->fused_qkv && decode_->fused_qk_norm;
}

bool DeviceCausalLM::decode_fuses_norm() const {
  return decode_ && decode_->fused_norm;
}

bool DeviceCausalLM::decode_fuses_head() const {
  return decode_ && decode_->fused_head;
}

bool DeviceCausalLM::decode_fuses_final_norm() const {
  return decode_ && decode_->fused_head && decode_->fused_final_norm;
}

int DeviceCausalLM::decode_skinny_gemms() const {
  return decode_ ? decode_->skinny_gemms : 0;
}

int DeviceCausalLM::decode_gemms() const {
  return decode_ ? decode_->gemms : 0;
}

bool DeviceCausalLM::decode_uses_package() const {
  return decode_ && decode_->package;
}

bool DeviceCausalLM::decode_overlaps() const {
  return decode_ && decode_->overlapped();
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
  if (d.buffers_batch != batch) {  // a new batch: its buffers, and a new graph
    d.graph.reset();
    const int64_t PP = d.shape.pages_per_sequence;
    std::vector<int32_t> table(static_cast<size_t>(B * PP));
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    d.block_table = empty({B, PP}, kI32);
    d.block_table.upload(stream_, table.data(), table.size() * sizeof(int32_t));
    d.seq_lens = empty({B}, kI32);
    d.positions = empty({B}, kI64);
    d.tokens = empty({B}, kI64);
    d.out_tokens = empty({B, d.shape.max_context}, kI64);
    d.step = empty({1}, kI32);
    d.argmax_scratch = empty({DecodeKernels::argmax_scratch_elems(B)}, kI64);
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
    d.norm_ss = empty({skinny_residual_tiles(H), kSkinnyMaxRows}, kF32);
    d.logits = empty({B, V}, t);
    if (layers_.front().qkv) d.qkv = empty({B, Q + 2 * KV}, t);
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
  d.argmax_scratch.zero(stream_);  // each argmax leaves it zeroed; a new batch starts so too
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
                           d.tokens, d.positions, d.seq_lens, d.out_tokens, d.step,
                           d.argmax_scratch);
  stream_.synchronize();
}

// K and V of the prompt ([batch * len, kv_dim] after RoPE) into the cache, for layer_forward.
void DeviceCausalLM::prefill_kv(const Layer& L, const Saved& s) {
  const auto layer = static_cast<size_t>(&L - layers_.data());
  const int64_t B = decode_->batch, S = decode_->len, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  decode_append(layer, s.k.view({B, S, NKV, HD}), s.v.view({B, S, NKV, HD}), decode_->rows(0, B));
}

void DeviceCausalLM::decode_append(size_t layer, const DeviceTensor& k4, const DeviceTensor& v4,
                                   const DecodeRows& r) {
  DecodeState& d = *decode_;
  DeviceTensor& kc = d.k_cache[layer];
  DeviceTensor& vc = d.v_cache[layer];
  if (!d.package) {
    d.kernels.append(stream_, k4, v4, r.block_table, r.seq_lens, kc, vc);
    return;
  }
  // The step's scratch is sized for one token per sequence; a prompt gets its own.
  DeviceTensor prompt_k, prompt_v, step_k = r.k16.view(r.k16.shape()),
                                   step_v = r.v16.view(r.v16.shape());
  const bool step = k4.shape() == r.k16.shape();
  DeviceTensor kb = bf16_of(kernels_, stream_, pool_, k4, step ? step_k : prompt_k);
  DeviceTensor vb = bf16_of(kernels_, stream_, pool_, v4, step ? step_v : prompt_v);
  if (bound(d.slots->paged_kv_append) &&
      call_slot(d.slots->paged_kv_append, kPagedKVAppend, false,
                {tensor_arg(&kb), tensor_arg(&vb), tensor_arg(&r.block_table),
                 tensor_arg(&r.seq_lens), tensor_arg(&kc), tensor_arg(&vc)}))
    return;
  // The package refused this model (a head_dim its kernels lack): the runtime's kernel on the
  // package's bf16 cache, from here on (refusals()).
  d.kernels.append(stream_, kb, vb, r.block_table, r.seq_lens, kc, vc);
}

void DeviceCausalLM::decode_attend(size_t layer, const DeviceTensor& q4, DeviceTensor& out4,
                                   DecodeRows& r) {
  DecodeState& d = *decode_;
  const DeviceTensor& kc = d.k_cache[layer];
  const DeviceTensor& vc = d.v_cache[layer];
  if (r.after) stream_.wait(*r.after);
  if (!d.package) {
    d.kernels.attend(stream_, q4, kc, vc, r.block_table, r.seq_lens, attention_scale(), out4);
  } else {
    DeviceTensor qb = bf16_of(kernels_, stream_, pool_, q4, r.q16);
    const bool cast_out = !same_dtype(out4.dtype(), kBF16);
    DeviceTensor ob = cast_out ? r.o16.view(out4.shape()) : out4.view(out4.shape());
    if (!bound(d.slots->paged_attention) ||
        !call_slot(d.slots->paged_attention, kPagedAttention, false,
                   {tensor_arg(&qb), tensor_arg(&kc), tensor_arg(&vc), tensor_arg(&r.block_table),
                    tensor_arg(&r.seq_lens), int_arg(-1), float_arg(attention_scale()),
                    tensor_arg(&ob), tensor_arg(&r.workspace)}))
      d.kernels.attend(stream_, qb, kc, vc, r.block_table, r.seq_lens, attention_scale(), ob);
    if (cast_out) kernels_.cast(stream_, ob, out4);
  }
  if (r.done) r.done->record(stream_);
}

// The model's members that take stream_ (linear, norm, the slot calls) enqueue on `other` while
// body() runs.
template <typename F>
void DeviceCausalLM::on_stream(DeviceStream& other, F&& body) {
  std::swap(stream_, other);
  try {
    body();
  } catch (...) {
    std::swap(stream_, other);
    throw;
  }
  std::swap(stream_, other);
}

// body() on `branch` after the work the model's stream has before decode_->fork, then `joined`
// recorded there.
template <typename F>
void DeviceCausalLM::on_branch(DeviceStream& branch, DeviceEvent& joined, F&& body) {
  branch.wait(decode_->fork);
  on_stream(branch, std::forward<F>(body));
  joined.record(branch);
}

// Whether decode_fused_qkv's path applies to layer L (it may still refuse a strided view).
bool DeviceCausalLM::fused_qkv_applies(const Layer& L) const {
  const DecodeState& d = *decode_;
  return L.qkv && d.package && bound(slots_.qk_norm_rotary) && bound(d.slots->paged_kv_append) &&
         bound(d.slots->paged_attention);
}

// The q/k norm + RoPE epilogue's operands for layer L's q/k/v GEMM on rows r.
SkinnyQkNormRope DeviceCausalLM::qk_norm_rope_epilogue(const Layer& L, const DecodeRows& r) const {
  return {&r.positions,
          &run(*L.q_norm),
          &run(*L.k_norm),
          cfg_.eps,
          &cos_,
          &sin_,
          static_cast<int>(cfg_.heads),
          static_cast<int>(cfg_.kv_heads)};
}

// Qwen3 in bf16 with the attention package (Layer::qkv): q, k and v of one GEMM, normed and
// rotated in place in r.qkv's rows, which the append and the attention read with their row
// stride: one launch and one pass over the weights instead of three projections; then the
// append and the attention in one launch where PagedAttentionWithKVAppend is bound (it refuses
// before writing anything: the two slots then serve). False when the path does not apply or a
// package refused a strided view (r.a is untouched and a repeated append writes the same cache
// rows): the caller then runs the separate projections. `pre`: r.h holds the residual and the
// attention norm folds into the GEMM (the caller checked that it takes it); else r.a is normed.
bool DeviceCausalLM::decode_fused_qkv(size_t layer, DecodeRows& r, const SkinnyPrenorm* pre) {
  DecodeState& d = *decode_;
  const Layer& L = layers_[layer];
  if (!fused_qkv_applies(L)) return false;
  const int64_t B = r.batch, NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  const int64_t Q = cfg_.q_dim(), KV = cfg_.kv_dim(), row = Q + 2 * KV;
  // DecodeFuse::kOn: the q/k norms and RoPE as the skinny GEMM's epilogue (Hopper), else the
  // slot on the GEMM's rows.
  bool normed = false;
  if (d.folds()) {
    const DeviceTensor& W = pre ? d.qkv_normed[layer] : run(*L.qkv);
    const SkinnyQkNormRope e = qk_norm_rope_epilogue(L, r);
    const DeviceTensor& x = pre ? r.h : r.a;
    if (d.skinny->qk_norm_rope_refusal(x, W, nullptr, r.qkv, e, pre).empty()) {
      ++d.gemms;
      ++d.skinny_gemms;
      timed(Phase::kGemm,
            [&] { d.skinny->run_qk_norm_rope(stream_, x, W, nullptr, r.qkv, e, pre); });
      normed = true;
    }
  }
  if (pre && !normed) invalid("decode: a folded attention norm that the q/k/v GEMM refused");
  if (!normed) {
    d.fused_qk_norm = false;
    decode_linear(r.a, *L.qkv, nullptr, r.qkv);
    const StridedArg q3(r.qkv, 0, {B, NH, HD}, {row, HD, 1});
    const StridedArg k3(r.qkv, Q, {B, NKV, HD}, {row, HD, 1});
    if (!call_slot(slots_.qk_norm_rotary, kQKNormRotaryEmbedding, false,
                   {tensor_arg(&r.positions), tensor_arg(&q3), tensor_arg(&k3),
                    tensor_arg(&run(*L.q_norm)), tensor_arg(&run(*L.k_norm)), float_arg(cfg_.eps),
                    tensor_arg(&cos_), tensor_arg(&sin_), int_arg(1)}))
      return false;
  }
  const StridedArg q4(r.qkv, 0, {B, 1, NH, HD}, {row, row, HD, 1});
  const StridedArg k4(r.qkv, Q, {B, 1, NKV, HD}, {row, row, HD, 1});
  const StridedArg v4(r.qkv, Q + KV, {B, 1, NKV, HD}, {row, row, HD, 1});
  DeviceTensor& kc = d.k_cache[layer];
  DeviceTensor& vc = d.v_cache[layer];
  DeviceTensor o4 = r.attn.view({B, 1, NH, HD});
  if (r.after) stream_.wait(*r.after);
  const auto fused = d.slots->attention_with_append;
  if (fused && bound(*fused) &&
      call_slot(*fused, kPagedAttentionWithKVAppend, false,
                {tensor_arg(&q4), tensor_arg(&k4), tensor_arg(&v4), tensor_arg(&kc),
                 tensor_arg(&vc), tensor_arg(&r.block_table), tensor_arg(&r.seq_lens), int_arg(-1),
                 float_arg(attention_scale()), tensor_arg(&o4), tensor_arg(&r.workspace)})) {
    if (r.done) r.done->record(stream_);
    return true;
  }
  d.fused_append = false;
  if (!call_slot(d.slots->paged_kv_append, kPagedKVAppend, false,
                 {tensor_arg(&k4), tensor_arg(&v4), tensor_arg(&r.block_table),
                  tensor_arg(&r.seq_lens), tensor_arg(&kc), tensor_arg(&vc)}))
    return false;
  if (!call_slot(d.slots->paged_attention, kPagedAttention, false,
                 {tensor_arg(&q4), tensor_arg(&kc), tensor_arg(&vc), tensor_arg(&r.block_table),
                  tensor_arg(&r.seq_lens), int_arg(-1), float_arg(attention_scale()),
                  tensor_arg(&o4), tensor_arg(&r.workspace)}))
    return false;
  if (r.done) r.done->record(stream_);
  return true;
}

// q, k and v projected apart (k and v on forked streams), Qwen3's q/k norms, RoPE, the append and
// the attention: r.attn.
void DeviceCausalLM::decode_projections(size_t layer, DecodeRows& r) {
  DecodeState& d = *decode_;
  const Layer& L = layers_[layer];
  const int64_t B = r.batch, NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  d.fork.record(stream_);
  on_branch(d.branch_v, d.joined_v, [&] { decode_linear(r.a, *L.wv, L.bv, r.v); });
  DeviceTensor q3 = r.q.view({B, NH, HD}), k3 = r.k.view({B, NKV, HD});
  bool rotated = false;
  if (L.q_norm && bound(slots_.qk_norm_rotary)) {
    // Qwen3: q and k projected into place, then their norms and RoPE in one pass.
    on_branch(d.branch_k, d.joined_k, [&] { decode_linear(r.a, *L.wk, L.bk, r.k); });
    decode_linear(r.a, *L.wq, L.bq, r.q);
    stream_.wait(d.joined_k);
    rotated = call_slot(slots_.qk_norm_rotary, kQKNormRotaryEmbedding, false,
                        {tensor_arg(&r.positions), tensor_arg(&q3), tensor_arg(&k3),
                         tensor_arg(&run(*L.q_norm)), tensor_arg(&run(*L.k_norm)),
                         float_arg(cfg_.eps), tensor_arg(&cos_), tensor_arg(&sin_), int_arg(1)});
    if (!rotated) {  // refused (nothing written): the composition below, from q_pre and k_pre
      stream_.copy(r.q_pre.data(), r.q.data(), r.q.bytes(), KH_COPY_D2D);
      stream_.copy(r.k_pre.data(), r.k.data(), r.k.bytes(), KH_COPY_D2D);
      DeviceTensor qn = r.q.view({B * NH, HD}), kn = r.k.view({B * NKV, HD});
      norm(r.q_pre.view({B * NH, HD}), *L.q_norm, qn, nullptr);
      norm(r.k_pre.view({B * NKV, HD}), *L.k_norm, kn, nullptr);
    }
  } else if (L.q_norm) {
    on_branch(d.branch_k, d.joined_k, [&] {
      decode_linear(r.a, *L.wk, L.bk, r.k_pre);
      DeviceTensor kn = r.k.view({B * NKV, HD});
      norm(r.k_pre.view({B * NKV, HD}), *L.k_norm, kn, nullptr);
    });
    decode_linear(r.a, *L.wq, L.bq, r.q_pre);
    DeviceTensor qn = r.q.view({B * NH, HD});
    norm(r.q_pre.view({B * NH, HD}), *L.q_norm, qn, nullptr);
  } else {
    on_branch(d.branch_k, d.joined_k, [&] { decode_linear(r.a, *L.wk, L.bk, r.k); });
    decode_linear(r.a, *L.wq, L.bq, r.q);
  }
  stream_.wait(d.joined_k);
  stream_.wait(d.joined_v);
  if (!rotated && bound(slots_.rotary))
    call_slot(slots_.rotary, kRotaryEmbedding, false,
              {tensor_arg(&r.positions), tensor_arg(&q3), tensor_arg(&k3), tensor_arg(&cos_),
               tensor_arg(&sin_), int_arg(1)});
  else if (!rotated)
    kernels_.rotary(stream_, r.positions, q3, &k3, cos_, sin_, /*neox=*/true, false);
  decode_append(layer, r.k.view({B, 1, NKV, HD}), r.v.view({B, 1, NKV, HD}), r);
  DeviceTensor o4 = r.attn.view({B, 1, NH, HD});
  decode_attend(layer, r.q.view({B, 1, NH, HD}), o4, r);
}

// A decode layer after its attention (in r.attn): the output projection, the residual add and
// norm, the MLP; its output is r.branch.
void DeviceCausalLM::decode_mlp(size_t layer, DecodeRows& r) {
  DecodeState& d = *decode_;
  const Layer& L = layers_[layer];
  const DeviceTensor& wo = run(*L.wo);
  const DeviceTensor* bo = L.bo ? &run(*L.bo) : nullptr;
  // The residual add + norm folded into the o projection (adding into h) and the gate/up GEMM
  // (the raw h times the weight with the norm's folded in), where both take it.
  const SkinnyPrenorm pre = d.prenorm(cfg_.eps);
  if (d.folds_norm() && d.skinny_takes(r.attn, wo, r.h) &&
      d.skinny->residual_refusal(r.attn, wo, bo, r.h, d.norm_ss).empty() &&
      d.skinny->silu_refusal(r.h, d.gate_up_normed[layer], r.s, &pre).empty()) {
    d.gemms += 2;
    d.skinny_gemms += 2;
    timed(Phase::kGemm, [&] {
      d.skinny->run_residual(stream_, r.attn, wo, bo, r.h, d.norm_ss);
      d.skinny->run_silu_and_mul(stream_, r.h, d.gate_up_normed[layer], r.s, &pre);
    });
  } else {
    d.fused_norm = false;
    decode_gate_up(L, r);
  }
  // The down projection adds into h where the next norm can fold (decode_layer, the final norm).
  const DeviceTensor& wdown = run(*L.wdown);
  d.residual_in_h = d.folds_norm() && d.skinny_takes(r.s, wdown, r.h) &&
                    d.skinny->residual_refusal(r.s, wdown, nullptr, r.h, d.norm_ss).empty();
  if (d.residual_in_h) {
    ++d.gemms;
    ++d.skinny_gemms;
    timed(Phase::kGemm,
          [&] { d.skinny->run_residual(stream_, r.s, wdown, nullptr, r.h, d.norm_ss); });
  } else {
    d.fused_norm = false;
    decode_linear(r.s, *L.wdown, nullptr, r.branch);
  }
}

// The o projection, the residual add + norm and gate/up with SiluAndMul, unfolded: r.s.
void DeviceCausalLM::decode_gate_up(const Layer& L, DecodeRows& r) {
  DecodeState& d = *decode_;
  decode_linear(r.attn, *L.wo, L.bo, r.branch);
  add_norm(r.branch, r.h.view(r.h.shape()), *L.mlp_norm, r.m, nullptr);
  const DeviceTensor& gate_up = run(*L.gate_up);
  if (d.folds() && d.skinny->silu_refusal(r.m, gate_up, r.s).empty()) {
    // gate/up and SiluAndMul in one launch: r.gu is never written.
    ++d.gemms;
    ++d.skinny_gemms;
    timed(Phase::kGemm, [&] { d.skinny->run_silu_and_mul(stream_, r.m, gate_up, r.s); });
  } else {
    d.fused_silu = false;
    decode_linear(r.m, *L.gate_up, nullptr, r.gu);
    if (bound(slots_.silu_and_mul))
      call_slot(slots_.silu_and_mul, kSiluAndMul, false, {tensor_arg(&r.gu), tensor_arg(&r.s)});
    else
      kernels_.silu_and_mul(stream_, r.gu, r.s);
  }
}

// A decode step's projection: the skinny GEMM where it takes the shapes (and, kAuto, where it is
// preferred), else linear()'s cuBLASLt.
void DeviceCausalLM::decode_linear(const DeviceTensor& x, const Param& w, const Param* bias,
                                   DeviceTensor& y) {
  DecodeState& d = *decode_;
  const DeviceTensor& W = run(w);
  ++d.gemms;
  if (!d.skinny_takes(x, W, y)) {
    linear(x, w, bias, y);
    return;
  }
  timed(Phase::kGemm, [&] { d.skinny->run(stream_, x, W, bias ? &run(*bias) : nullptr, y); });
  ++d.skinny_gemms;
}

// The residual stream is r.h + the last MLP's r.branch: each pre-norm adds it in place (eval:
// add_norm allocates nothing), in one FusedAddRMSNorm pass when the package serves it.
//
// Where the last MLP's down projection added into h (DecodeState::residual_in_h), the attention
// norm folds into the q/k/v GEMM (it reads h and scales its rows by their rstd) when that takes
// it, else it is a plain RMSNorm of h.
void DeviceCausalLM::decode_layer(size_t layer, DecodeRows& r) {
  DecodeState& d = *decode_;
  const Layer& L = layers_[layer];
  const DeviceTensor none;
  const bool in_h = layer > 0 && d.residual_in_h;
  std::optional<SkinnyPrenorm> pre;
  if (in_h && d.folds_norm() && fused_qkv_applies(L)) {
    pre = d.prenorm(cfg_.eps);
    const SkinnyQkNormRope e = qk_norm_rope_epilogue(L, r);
    if (!d.skinny->qk_norm_rope_refusal(r.h, d.qkv_normed[layer], nullptr, r.qkv, e, &*pre).empty())
      pre.reset();
  }
  if (!pre) {
    if (layer > 0) d.fused_norm = false;
    add_norm(layer == 0 || in_h ? none : r.branch, r.h.view(r.h.shape()), *L.attn_norm, r.a,
             nullptr);
  }
  if (!decode_fused_qkv(layer, r, pre ? &*pre : nullptr)) {
    d.fused_qkv = d.fused_append = d.fused_qk_norm = false;
    // A slot refused after the folded GEMM: the projections again, from the norm written out.
    if (pre) add_norm(none, r.h.view(r.h.shape()), *L.attn_norm, r.a, nullptr);
    decode_projections(layer, r);
  }
  decode_mlp(layer, r);
}

// The folded norms' weights (DecodeState::qkv_normed, gate_up_normed), allocated once and
// refolded whenever an adam step changed the weights since: outside any capture (decode_step,
// before its launch), so a captured step reads the current ones.
void DeviceCausalLM::fold_norm_weights() {
  DecodeState& d = *decode_;
  if (!d.folds_norm() || d.normed_at == adam_t_) return;
  if (d.gate_up_normed.empty())
    for (const Layer& L : layers_) {
      d.qkv_normed.push_back(L.qkv ? empty(run(*L.qkv).shape(), kBF16) : DeviceTensor{});
      d.gate_up_normed.push_back(empty(run(*L.gate_up).shape(), kBF16));
    }
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    if (L.qkv) kernels_.scale_columns(stream_, run(*L.qkv), run(*L.attn_norm), d.qkv_normed[l]);
    kernels_.scale_columns(stream_, run(*L.gate_up), run(*L.mlp_norm), d.gate_up_normed[l]);
  }
  d.normed_at = adam_t_;
}

// One token per sequence through the layers, on the step's buffers (the host model's
// layer_forward for a single position, reading the cache for attention), ending with the greedy
// argmax that feeds the next step. Allocates nothing: it is what the graph captures.
//
// Overlapped (DecodeOverlap), the halves' layers are enqueued in turns, the second half's on its
// own stream, and their attentions alternate (each waits for the other's last): while one half
// reads its K/V, the other runs its projections and MLP.
void DeviceCausalLM::decode_launch() {
  DecodeState& d = *decode_;
  const int64_t B = d.batch, V = cfg_.vocab;
  kernels_.embedding_forward(stream_, run(*emb_), d.tokens, d.h);
  d.fused_qkv = true;
  d.fused_append = true;
  d.fused_silu = true;
  d.fused_qk_norm = true;
  d.fused_norm = d.folds_norm();
  d.residual_in_h = false;
  d.skinny_gemms = d.gemms = 0;
  if (d.overlapped()) {
    DecodeRows first = d.rows(0, B / 2), second = d.rows(B / 2, B - B / 2);
    first.done = second.after = &d.attended[0];
    second.done = &d.attended[1];
    d.halves_fork.record(stream_);
    d.second_half.wait(d.halves_fork);
    for (size_t l = 0; l < layers_.size(); ++l) {
      first.after = l == 0 ? nullptr : &d.attended[1];
      decode_layer(l, first);
      on_stream(d.second_half, [&] { decode_layer(l, second); });
    }
    d.halves_joined.record(d.second_half);
    stream_.wait(d.halves_joined);
  } else {
    DecodeRows all = d.rows(0, B);
    for (size_t l = 0; l < layers_.size(); ++l) decode_layer(l, all);
  }
  if (decode_head_argmax(/*fold_norm=*/true)) return;
  const DeviceTensor none;  // the last down projection added into h (residual_in_h)
  add_norm(d.residual_in_h ? none : d.branch, d.h.view(d.h.shape()), *final_norm_, d.f, nullptr);
  if (decode_head_argmax(/*fold_norm=*/false)) return;
  decode_linear(d.f, *head_, nullptr, d.logits);
  d.kernels.argmax_advance(stream_, d.logits, 0, V, B, V, d.tokens, d.positions, d.seq_lens,
                           d.out_tokens, d.step, d.argmax_scratch);
}

// The step's end as one skinny GEMM where it takes it (DecodeFuse::kOn on Hopper, hidden <=
// kSkinnyHeadMaxK): the LM head writes the logits and its epilogue the greedy tokens
// (SkinnyGemm::run_head_argmax). fold_norm: from the raw residual, the final norm folded in, where
// the last down projection left it and its sums of squares (folds_norm); else from the normed
// rows. False, having launched nothing, where it does not take them.
bool DeviceCausalLM::decode_head_argmax(bool fold_norm) {
  DecodeState& d = *decode_;
  d.fused_head = d.fused_final_norm = false;
  if (!d.folds() || (fold_norm && !(d.residual_in_h && d.folds_norm()))) return false;
  const DeviceTensor& W = run(*head_);
  const SkinnyGreedy g{&d.tokens,     &d.positions, &d.seq_lens,
                       &d.out_tokens, &d.step,      &d.argmax_scratch};
  const DeviceTensor& x = fold_norm ? d.h : d.f;
  std::optional<SkinnyHeadNorm> norm;
  if (fold_norm) norm = SkinnyHeadNorm{d.prenorm(cfg_.eps), &run(*final_norm_)};
  const SkinnyHeadNorm* n = norm ? &*norm : nullptr;
  if (!d.skinny->head_argmax_refusal(x, W, d.logits, g, n).empty()) return false;
  ++d.gemms;
  ++d.skinny_gemms;
  timed(Phase::kGemm, [&] { d.skinny->run_head_argmax(stream_, x, W, d.logits, g, n); });
  d.fused_head = true;
  d.fused_final_norm = fold_norm;
  return true;
}

void DeviceCausalLM::decode_step(const int64_t* tokens, bool graph) {
  if (!decode_ || decode_->batch == 0) invalid("decode_step before prefill");
  DecodeState& d = *decode_;
  if (runtime_.mode() != Mode::kEval)
    invalid("prefill and decode run in eval mode; set_mode(eval) first");
  fold_norm_weights();
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
