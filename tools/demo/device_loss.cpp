// DeviceCausalLM's LM head (device_model.h): the last tokens' logits for generation, and the
// loss without the [tokens, vocab] logits: the FusedLinearCrossEntropy slot's package, or the
// runtime's own chunks of logits on kh_gemm.
#include "tools/demo/device_model.h"

#include <algorithm>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/device_linear.h"

namespace kh::demo {

void DeviceCausalLM::last_token_logits() {
  const int64_t H = cfg_.hidden;
  DeviceTensor last = act({batch_, H});
  for (int64_t b = 0; b < batch_; ++b)
    stream_.copy(last.rows(b, 1).data(), f_.rows(b * len_ + len_ - 1, 1).data(),
                 last.bytes() / static_cast<size_t>(batch_), KH_COPY_D2D);
  logits_ = act({batch_, cfg_.vocab});
  linear(last, *head_, nullptr, logits_);
}

float DeviceCausalLM::fused_loss(bool grad) {
  const int64_t T = static_cast<int64_t>(batch_) * len_, H = cfg_.hidden, V = cfg_.vocab;
  const DeviceTensor& head = run(*head_);
  if (grad) {
    ensure_grad(*head_);  // the layers' come with their backward (ensure_layer_grads)
    df_ = act({T, H});
  }
  if (bound(slots_.linear_cross_entropy)) {
    // kernel-hub/softmax's FusedLinearCrossEntropy: the mean loss, and in train d_hidden and
    // d_weight (fp32, overwritten) of it. Its workspace (linear_ce.h): 256 bytes of scalars, the
    // per-token losses, then chunk rows of V logits (+ 256 to align the start).
    const int64_t chunk = std::min(T, options_.loss_chunk_rows);
    const int64_t elem = act_.bits / 8;
    const int64_t bytes = 256 + (T * 4 + 255) / 256 * 256 + chunk * V * elem + 256;
    DeviceTensor workspace = empty({bytes}, kU8);
    DeviceTensor loss = empty({1});
    bool served = false;
    if (grad) {
      // d_weight is overwritten: straight into a zero gradient, else through a scratch added.
      const bool fresh = head_->g_zero;
      DeviceTensor dw = fresh ? head_->g.view(head_->g.shape()) : empty({V, H});
      served = call_slot(
          slots_.linear_cross_entropy, kFusedLinearCrossEntropy, false,
          {tensor_arg(&f_), tensor_arg(&head), tensor_arg(&targets_), int_arg(kIgnoreIndex),
           tensor_arg(&workspace), tensor_arg(&loss), tensor_arg(&df_), tensor_arg(&dw)});
      // The loss is the mean: its upstream gradient is 1, so the backward op (which scales
      // d_hidden and d_weight by it) has nothing to do.
      if (served && !fresh) kernels_.add(stream_, head_->g, dw, head_->g);
      if (served) head_->g_zero = false;
    } else {
      served = call_slot(slots_.linear_cross_entropy, kFusedLinearCrossEntropy, false,
                         {tensor_arg(&f_), tensor_arg(&head), tensor_arg(&targets_),
                          int_arg(kIgnoreIndex), tensor_arg(&workspace), tensor_arg(&loss)});
    }
    if (served) {
      float host = 0;
      loss.download(stream_, &host, sizeof host);
      stream_.synchronize();
      return host;
    }
  }
  // The runtime's own: chunk rows of logits at a time (GEMM), cross-entropy with the gradient
  // (softmax - onehot) / T written over the logits, then dhidden = dlogits . W and
  // dW += dlogits^T . hidden (two GEMMs) before the next chunk reuses the buffer.
  loss_ = empty({T});
  const int64_t chunk = std::min(T, options_.loss_chunk_rows);
  DeviceTensor logits = act({chunk, V});
  bool ce_package = bound(slots_.cross_entropy);
  DeviceTensor dlogits = grad && ce_package ? act({chunk, V}) : DeviceTensor();
  const float scale = 1.0f / static_cast<float>(T);
  for (int64_t r0 = 0; r0 < T; r0 += chunk) {
    const int64_t n = std::min(chunk, T - r0);
    DeviceTensor f_c = f_.rows(r0, n), logits_c = logits.rows(0, n), loss_c = loss_.rows(r0, n);
    DeviceTensor targets_c = targets_.rows(r0, n);
    timed(Phase::kGemm, [&] { linear_forward(stream_, f_c, head, logits_c); });
    DeviceTensor dlogits_c = grad && ce_package ? dlogits.rows(0, n) : logits_c.view({n, V});
    std::vector<kh_arg_t> args = {tensor_arg(&logits_c), tensor_arg(&targets_c),
                                  int_arg(kIgnoreIndex)};
    if (grad)
      args.insert(args.end(), {float_arg(scale), tensor_arg(&loss_c), tensor_arg(&dlogits_c)});
    else
      args.push_back(tensor_arg(&loss_c));
    ce_package = ce_package && call_slot(slots_.cross_entropy, kCrossEntropy, false, args);
    if (!ce_package)  // dlogits_c: the package's buffer or, in place, the logits
      kernels_.cross_entropy(stream_, logits_c, targets_c, kIgnoreIndex, scale, loss_c,
                             grad ? &dlogits_c : nullptr);
    if (grad) {
      DeviceTensor df_c = df_.rows(r0, n);
      timed(Phase::kGemm, [&, fresh = take_zero(*head_)] {
        linear_backward(stream_, f_c, head, dlogits_c, &df_c, &head_->g, false, !fresh);
      });
    }
  }
  return mean_loss();
}

float DeviceCausalLM::mean_loss() {
  std::vector<float> host(static_cast<size_t>(loss_.numel()));
  loss_.download(stream_, host.data(), host.size() * sizeof(float));
  stream_.synchronize();
  double sum = 0;
  for (float v : host) sum += v;
  return static_cast<float>(sum / static_cast<double>(host.size()));
}

}  // namespace kh::demo
