#!/usr/bin/env python3
"""The kernel_hub Python package under PyTorch and Transformers, on cpu with the hub's cpu
packages (the build tree's default hub): tiny Qwen3 and Llama models (from config, random init,
fp32) kernelized against eager copies: logits, losses and gradients match, every replaced layer
ran the bound kernel (calls counted per layer and mode), model.train()/eval() publish the other
table, the KernelConfig forms Transformers users write resolve through the C API,
torch.compile(fullgraph=True) runs the kernelized model, errors carry the C API's status.
Also pull / lock / trust_status through the CLI.

Usage: test_torch_bridge.py (with KERNEL_HUB_LIBRARY, KERNEL_HUB_CLI set and tools/python on
PYTHONPATH, as CTest runs it). Exit 77 (skipped) when torch or transformers is missing."""
import collections
import os
import sys
import tempfile
import unittest

try:
    import torch
    import transformers
except ImportError as e:
    print(f"SKIPPED: the PyTorch bridge tests need torch and transformers ({e}); configure with "
          "-DKH_TORCH_PYTHON=/path/to/python (README 'PyTorch and Transformers')")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "python"))
import kernel_hub  # noqa: E402
from kernel_hub.runtime import Runtime  # noqa: E402

SEQ = 12


def tiny(family):
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  # Weights large enough that attention is far from uniform: a wrong rotation or
                  # mask changes the logits beyond the tolerance.
                  initializer_range=0.25)
    if family == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **common))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))


def pair(family, seed=0):
    """An eager model and a copy with the same weights."""
    torch.manual_seed(seed)
    eager = tiny(family).float()
    copy = tiny(family).float()
    copy.load_state_dict(eager.state_dict())
    return eager, copy


class Calls:
    """Counts Runtime.call per (layer, mode, backward): proof that the bound kernel ran."""

    def __init__(self):
        self.counts = collections.Counter()
        self._orig = Runtime.call

    def __enter__(self):
        counts, orig = self.counts, self._orig

        def counting(rt, layer, args, backward=False):
            counts[(layer, rt.mode, "backward" if backward else "forward")] += 1
            return orig(rt, layer, args, backward)

        Runtime.call = counting
        return self.counts

    def __exit__(self, *exc):
        Runtime.call = self._orig


def cache_of(output):
    """A model output's KV cache (Transformers 5 names the field cache, 4 past_key_values)."""
    return getattr(output, "cache", None) or getattr(output, "past_key_values", None)


def layers_called(counts, mode, direction="forward"):
    return {layer for (layer, m, d), n in counts.items() if m == mode and d == direction and n}


ALL = {"RMSNorm", "SiluAndMul", "RotaryEmbedding", "CrossEntropy", "Attention",
       "FusedLinearCrossEntropy"}
# In eval the model computes logits (ForCausalLMLoss -> CrossEntropy); in training with labels the
# fused lm_head + loss runs instead of lm_head and CrossEntropy.
EVAL_CALLED = ALL - {"FusedLinearCrossEntropy"}
TRAIN_CALLED = ALL - {"CrossEntropy"}


class BridgeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        os.environ["KERNEL_HUB_CACHE"] = os.path.join(cls.tmp.name, "cache")
        os.environ.pop("KERNEL_HUB_ENDPOINT", None)
        # Inductor's caches of this run only: AOTAutograd's cache is keyed by the traced forward,
        # so a warm cache from an older kernel_hub could replay that version's backward.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cls.tmp.name, "inductor")

    def ids(self, seed=1):
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, 96, (2, SEQ), generator=g)

    def check_model(self, family):
        eager, model = pair(family)
        kernel_hub.kernelize(model, device="cpu")
        rt = model.kernel_hub_runtime
        self.assertEqual(set(rt.bound["eval"]), ALL, rt.report)
        self.assertEqual(set(rt.bound["train"]), ALL, rt.report)
        n_norms = 2 * 2 + 1 + (4 if family == "qwen3" else 0)  # + q_norm/k_norm per layer
        self.assertEqual(model.kernel_hub_replaced["RMSNorm"], n_norms)
        self.assertEqual(model.config._attn_implementation, "kernel_hub")
        ids = self.ids()

        # Eval: logits and loss within fp32 tolerance; every layer ran its eval op.
        eager.eval()
        model.eval()
        self.assertEqual(rt.mode, "eval")
        with torch.no_grad(), Calls() as calls:
            want, got = eager(ids, labels=ids), model(ids, labels=ids)
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
        self.assertEqual(layers_called(calls, "eval"), EVAL_CALLED, calls)
        self.assertEqual(calls[("RMSNorm", "eval", "forward")], n_norms)

        # Train: forward_train and backward ops; gradients match eager's.
        eager.train()
        model.train()
        self.assertEqual(rt.mode, "train")
        self.assertEqual(rt.native_mode(), "train")
        want = eager(ids, labels=ids)
        with Calls() as calls:
            got = model(ids, labels=ids)
            got.loss.backward()
        want.loss.backward()
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
        self.assertIsNone(got.logits)  # the fused loss never forms them
        self.assertIsNone(cache_of(got))  # no KV cache in a training forward
        self.assertEqual(layers_called(calls, "train"), TRAIN_CALLED, calls)
        self.assertEqual(layers_called(calls, "train", "backward"), TRAIN_CALLED, calls)
        self.assertFalse(layers_called(calls, "eval"), calls)
        for (name, p), (_, q) in zip(eager.named_parameters(), model.named_parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)

        # Back to eval: the eval table again.
        model.eval()
        self.assertEqual(rt.native_mode(), "eval")
        with torch.no_grad(), Calls() as calls:
            out = model(ids)
        self.assertEqual(layers_called(calls, "eval"), EVAL_CALLED - {"CrossEntropy"}, calls)
        self.assertFalse(layers_called(calls, "train"), calls)
        self.assertIsNotNone(cache_of(out))  # eval keeps Transformers' cache
        return eager, model

    def test_qwen3(self):
        eager, model = self.check_model("qwen3")
        # The swapped forwards keep the originals' signatures: Transformers' Trainer picks the
        # dataset columns it passes from inspect.signature(model.forward).
        import inspect
        for original, swapped in ((eager, model), (eager.model.norm, model.model.norm),
                                  (eager.model.layers[0].mlp, model.model.layers[0].mlp)):
            self.assertNotEqual(type(original), type(swapped))
            self.assertEqual(inspect.signature(swapped.forward),
                             inspect.signature(original.forward))

    def test_llama(self):
        self.check_model("llama")

    def test_compile_fullgraph(self):
        eager, model = pair("qwen3")
        kernel_hub.kernelize(model, device="cpu", inductor_layers=())  # every kernel, compiled
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)  # a graph break raises
        ids = self.ids(2)
        eager.eval()
        model.eval()
        with torch.no_grad(), Calls() as calls:
            want, got = eager(ids, labels=ids), compiled(ids, labels=ids)
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
        self.assertEqual(layers_called(calls, "eval"), EVAL_CALLED, calls)
        eager.train()
        compiled.train()  # recompiles for the train table (guards on the runtime's mode)
        self.assertEqual(model.kernel_hub_runtime.mode, "train")
        with Calls() as calls:
            got = compiled(ids, labels=ids)
            got.loss.backward()
        want = eager(ids, labels=ids)
        want.loss.backward()
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
        self.assertEqual(layers_called(calls, "train", "backward"), TRAIN_CALLED, calls)
        for (name, p), (_, q) in zip(eager.named_parameters(), model.named_parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)

    def test_compile_leaves_inductor_layers_to_inductor(self):
        # The default: rotary and SiluAndMul keep PyTorch's code while torch.compile traces (for
        # Inductor to fuse); eager calls of the same model still use every kernel.
        self.assertEqual(set(kernel_hub.INDUCTOR_LAYERS), {"RotaryEmbedding", "SiluAndMul"})
        eager, model = pair("llama")
        kernel_hub.kernelize(model, device="cpu")
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        ids = self.ids(8)
        eager.eval()
        model.eval()
        with torch.no_grad(), Calls() as calls:
            want, got = eager(ids, labels=ids), compiled(ids, labels=ids)
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
        self.assertEqual(layers_called(calls, "eval"),
                         EVAL_CALLED - set(kernel_hub.INDUCTOR_LAYERS), calls)
        with torch.no_grad(), Calls() as calls:
            model(ids)
        self.assertEqual(layers_called(calls, "eval"), EVAL_CALLED - {"CrossEntropy"}, calls)
        with self.assertRaises(ValueError):
            kernel_hub.kernelize(model, device="cpu", inductor_layers=("NoSuchLayer",))

    def test_training_saves_what_liger_saves(self):
        # The op-by-op audit against Liger-Kernel 0.8.5's saved tensors, as bytes of the storages
        # autograd keeps for backward (parameters aside), exactly. Per decoder layer and token:
        #   input_layernorm  x [H], rstd fp32 [1]        (Liger's RMSNorm: X, RSTD)
        #   q/k/v_proj       their input, the norm's output [H]
        #   q_norm, k_norm   x [Q], [K], rstd [qh], [kvh]
        #   attention        q, k (rotated) [Q], [K], v [K], out [Q] (o_proj's input), lse [qh]
        #                    (SDPA's)
        #   post_attention_layernorm  x [H], rstd [1]; gate/up input [H]
        #   SiluAndMul       [gate, up] [2I] (Liger's a, b); down_proj's input [I]
        # and once: input ids, cos and sin, the final norm (x, rstd), the fused loss's d_hidden
        # [T, H] and d_weight [V, H] in the weight's dtype (no logits, no fp32 copy).
        # The caller's saved-tensor hooks here turn the norm-output recomputation off
        # (test_training_recomputes_norm_outputs measures with it).
        eager, model = pair("qwen3")
        model.to(torch.bfloat16)  # where an fp32 copy would show
        kernel_hub.kernelize(model, device="cpu")
        model.train()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        saved = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in params:
                saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        ids = self.ids(9)
        with Calls() as calls, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(ids, labels=ids).loss.backward()
        self.assertEqual(layers_called(calls, "train", "backward"), TRAIN_CALLED, calls)
        # The norms ran in the forward only: nothing recomputed.
        self.assertEqual(calls[("RMSNorm", "train", "forward")],
                         model.kernel_hub_replaced["RMSNorm"])
        self.assertEqual(sum(saved.values()), self.liger_saved_bytes(model, ids))

    @staticmethod
    def liger_saved_bytes(model, ids, norm_outputs_per_layer=2):
        """test_training_saves_what_liger_saves's count for a bf16 Qwen3; norm_outputs_per_layer
        0 leaves out the input_layernorm's and post_attention_layernorm's outputs."""
        c = model.config
        t, h, i = ids.numel(), c.hidden_size, c.intermediate_size
        qh, kvh = c.num_attention_heads, c.num_key_value_heads
        q, k = qh * c.head_dim, kvh * c.head_dim
        f = 2  # bf16; rstd and lse are fp32
        layer = (t * ((2 + norm_outputs_per_layer) * h + 3 * q + 3 * k + 3 * i) * f
                 + t * (2 + 2 * qh + kvh) * 4)
        once = (ids.numel() * 8 + 2 * ids.shape[1] * c.head_dim * f + t * h * f + t * 4 +
                t * h * f + c.vocab_size * h * f)
        return c.num_hidden_layers * layer + once

    def test_training_recomputes_norm_outputs(self):
        # The kernelized training forward keeps neither the input_layernorm's output (q/k/v_proj's
        # input) nor the post_attention_layernorm's (the MLP's): backward recomputes each once,
        # from the norm's input that the norm keeps anyway. What the hooks keep is the audit
        # above less those two [tokens, hidden] per layer; gradients as without.
        from kernel_hub import bridge
        eager, model = pair("qwen3")
        eager.to(torch.bfloat16)
        model.to(torch.bfloat16)
        kernel_hub.kernelize(model, device="cpu")
        model.train()
        eager.train()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        kept = {}
        pack = bridge._NormRecompute.pack

        def counting_pack(scope, t):
            packed = pack(scope, t)
            if isinstance(packed, tuple):
                ptr = packed[0].untyped_storage().data_ptr()
                if ptr not in params:
                    kept[ptr] = packed[0].untyped_storage().nbytes()
            return packed

        ids = self.ids(9)
        bridge._NormRecompute.pack = counting_pack
        try:
            with Calls() as forward_calls:
                loss = model(ids, labels=ids).loss
        finally:
            bridge._NormRecompute.pack = pack
        with Calls() as backward_calls:
            loss.backward()
        n_layers = model.config.num_hidden_layers
        # The fused loss runs after the decoder, outside the hooks: autograd keeps its d_hidden
        # [T, H] and d_weight [V, H] itself.
        c = model.config
        lce = ids.numel() * c.hidden_size * 2 + c.vocab_size * c.hidden_size * 2
        self.assertEqual(sum(kept.values()) + lce, self.liger_saved_bytes(model, ids, 0))
        self.assertEqual(forward_calls[("RMSNorm", "train", "forward")],
                         model.kernel_hub_replaced["RMSNorm"])
        self.assertEqual(backward_calls[("RMSNorm", "train", "forward")], 2 * n_layers)
        # Same gradients as with the outputs kept (bit for bit: the same kernel recomputes them).
        os.environ["KERNEL_HUB_RECOMPUTE_NORM"] = "0"
        try:
            with Calls() as calls:
                kept_model = tiny("qwen3").to(torch.bfloat16)
                kept_model.load_state_dict(model.state_dict())
                kernel_hub.kernelize(kept_model, device="cpu")
                kept_model.train()
                want = kept_model(ids, labels=ids).loss
                want.backward()
            self.assertEqual(calls[("RMSNorm", "train", "forward")],
                             model.kernel_hub_replaced["RMSNorm"])
        finally:
            del os.environ["KERNEL_HUB_RECOMPUTE_NORM"]
        self.assertEqual(loss.item(), want.item())
        for (name, p), (_, q) in zip(kept_model.named_parameters(), model.named_parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)

        # A saved tensor modified in place before backward is refused, as autograd does
        # without hooks.
        loss = model(ids, labels=ids).loss
        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight.add_(1.0)
        with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
            loss.backward()

        # A forward without backward leaves nothing alive: the hooks keep saved outputs
        # detached (an op's output with its node would be a reference cycle through C++).
        import gc
        import weakref
        kh = model._kernel_hub
        x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
        w = model.model.norm.weight

        def forward():
            _y, rstd = kernel_hub.ops.rms_norm_train(x, w, 1e-6, model.kernel_hub_runtime.id)
            return weakref.ref(rstd)

        ref = bridge._run_recomputing_norms(kh, forward)
        gc.collect()
        self.assertIsNone(ref())

    def test_mlp_projection_hooks_still_run(self):
        # The MLP writes gate and up into one buffer with two GEMMs; a projection with a hook
        # (an adapter, a quantizer, a profiler) keeps its Linear call instead.
        eager, model = pair("llama")
        kernel_hub.kernelize(model, device="cpu")
        seen = []
        model.model.layers[0].mlp.gate_proj.register_forward_hook(lambda *a: seen.append(1))
        eager.train()
        model.train()
        ids = self.ids(10)
        with Calls() as calls:
            got = model(ids, labels=ids)
            got.loss.backward()
        want = eager(ids, labels=ids)
        want.loss.backward()
        self.assertEqual(len(seen), 1)
        self.assertEqual(calls[("SiluAndMul", "train", "forward")], 2, calls)
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
        for (name, p), (_, q) in zip(eager.named_parameters(), model.named_parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)

    def test_generate_with_kv_cache(self):
        # Decode steps: one query against the cache (the kernel's bottom-right causal mask).
        eager, model = pair("llama")
        kernel_hub.kernelize(model, device="cpu")
        eager.eval()
        model.eval()
        ids = self.ids(6)[:1, :5]
        with torch.no_grad(), Calls() as calls:
            got = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        want = eager.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        self.assertEqual(got.tolist(), want.tolist())
        self.assertGreaterEqual(calls[("Attention", "eval", "forward")], 2 * 6, calls)

    def test_transformers_config_forms(self):
        # Transformers' names and forms; values go to the C API as written.
        eager, model = pair("llama")
        config = {
            "RMSNorm": {"cuda": "kernel-hub/norm:RMSNorm", "cpu": "kernel-hub/norm"},
            "rotary_pos_emb": ["kernel-hub/rotary", {"version": 1}],
            "SiluAndMul": {"cpu": {"eval": "kernel-hub/activation"}},  # eval only
            "ForCausalLMLoss": "kernel-hub/softmax@v1",
        }
        kernel_hub.kernelize(model, config=config, device="cpu")
        rt = model.kernel_hub_runtime
        self.assertEqual(set(rt.bound["eval"]),
                         {"RMSNorm", "RotaryEmbedding", "SiluAndMul", "CrossEntropy"})
        self.assertEqual(set(rt.bound["train"]), {"RMSNorm", "RotaryEmbedding", "CrossEntropy"})
        self.assertNotEqual(model.config._attn_implementation, "kernel_hub")  # not mapped
        ids = self.ids(3)
        eager.train()
        model.train()
        with Calls() as calls:
            got = model(ids, labels=ids)
            got.loss.backward()
        want = eager(ids, labels=ids)
        want.loss.backward()
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
        # SiluAndMul has no train binding: PyTorch's MLP ran in train mode.
        self.assertNotIn(("SiluAndMul", "train", "forward"), calls)
        self.assertIn(("RMSNorm", "train", "backward"), calls)
        for (name, p), (_, q) in zip(eager.named_parameters(), model.named_parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)

    def test_fused_linear_cross_entropy(self):
        # Training with ignored labels and num_items_in_batch (the Trainer's gradient
        # accumulation form): the fused lm_head + loss against torch's, loss and every gradient.
        for num_items in (None, 17):
            eager, model = pair("qwen3", seed=3)
            kernel_hub.kernelize(model, config={"FusedLinearCrossEntropy": "kernel-hub/softmax"},
                                 device="cpu")
            self.assertEqual(model.kernel_hub_replaced["FusedLinearCrossEntropy"], 1)
            ids = self.ids(7)
            labels = ids.clone()
            labels[0, :4] = -100
            labels[1, 5] = -100
            eager.train()
            model.train()
            extra = {} if num_items is None else {"num_items_in_batch": num_items}
            with Calls() as calls:
                got = model(ids, labels=labels, **extra)
                got.loss.backward()
            want = eager(ids, labels=labels, **extra)
            want.loss.backward()
            self.assertEqual(set(calls), {("FusedLinearCrossEntropy", "train", "forward"),
                                          ("FusedLinearCrossEntropy", "train", "backward")})
            self.assertIsNone(got.logits)
            torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
            for (name, p), (_, q) in zip(eager.named_parameters(), model.named_parameters()):
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
            # Eval computes logits (and the plain loss) as before.
            model.eval()
            eager.eval()
            with torch.no_grad():
                got, want = model(ids, labels=labels), eager(ids, labels=labels)
            torch.testing.assert_close(got.logits, want.logits)
            torch.testing.assert_close(got.loss, want.loss)

    def test_fused_op_matches_torch_with_all_tokens_ignored(self):
        eager, model = pair("llama")
        kernel_hub.kernelize(model, config={"FusedLinearCrossEntropy": "kernel-hub/softmax"},
                             device="cpu", mode="train")
        model.train()  # publishes the train table the ops below call
        rt = model.kernel_hub_runtime
        g = torch.Generator().manual_seed(9)
        h = torch.randn(11, 64, generator=g, requires_grad=True)
        w = torch.randn(96, 64, generator=g, requires_grad=True)
        labels = torch.full((11,), -100, dtype=torch.int64)
        loss = kernel_hub.ops.linear_cross_entropy_train(h, w, labels, -100, rt.id)[0]
        loss.backward()
        self.assertEqual(loss.item(), 0.0)
        self.assertTrue(torch.all(h.grad == 0) and torch.all(w.grad == 0))
        labels[3:] = torch.randint(0, 96, (8,), generator=g)
        h.grad = w.grad = None
        loss = kernel_hub.ops.linear_cross_entropy_train(h, w, labels, -100, rt.id)[0]
        (2.0 * loss).backward()
        h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        want = torch.nn.functional.cross_entropy(h2 @ w2.t(), labels, ignore_index=-100)
        (2.0 * want).backward()
        torch.testing.assert_close(loss, want)
        torch.testing.assert_close(h.grad, h2.grad)
        torch.testing.assert_close(w.grad, w2.grad)
        # The backward scales the saved gradients in place: a second backward through a retained
        # graph is refused (torch's version check) rather than given scaled gradients.
        loss = kernel_hub.ops.linear_cross_entropy_train(h, w, labels, -100, rt.id)[0]
        (3.0 * loss).backward(retain_graph=True)
        with self.assertRaisesRegex(RuntimeError, "inplace"):
            loss.backward()
        # bf16: d_weight comes back in the weight's dtype (accumulated per chunk in bf16, as Liger
        # does), within bf16 tolerance of an fp32 reference, over several chunks of tokens.
        n = 300
        hb = torch.randn(n, 64, generator=g).bfloat16().requires_grad_()
        wb = torch.randn(96, 64, generator=g).bfloat16().requires_grad_()
        lb = torch.randint(0, 96, (n,), generator=g)
        chunk = kernel_hub.ops.LCE_CHUNK_BYTES
        kernel_hub.ops.LCE_CHUNK_BYTES = 128 * 96 * 2  # 128 rows: 3 chunks
        try:
            out = kernel_hub.ops.linear_cross_entropy_train(hb, wb, lb, -100, rt.id)
        finally:
            kernel_hub.ops.LCE_CHUNK_BYTES = chunk
        self.assertEqual(out[2].dtype, torch.bfloat16)
        out[0].backward()
        self.assertEqual(wb.grad.dtype, torch.bfloat16)
        h2, w2 = hb.detach().float().requires_grad_(), wb.detach().float().requires_grad_()
        want = torch.nn.functional.cross_entropy(h2 @ w2.t(), lb)
        want.backward()
        torch.testing.assert_close(out[0], want, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(hb.grad.float(), h2.grad, rtol=2e-2, atol=1e-3)
        torch.testing.assert_close(wb.grad.float(), w2.grad, rtol=2e-2, atol=1e-3)

    def test_unused_outputs_get_no_zero_gradients(self):
        # Autograd would hand each op's backward a zero tensor of every output's size that was not
        # used (the fused loss's d_weight: [vocab, hidden], at the start of backward, the step's
        # memory peak). The ops ask for None instead: their backward allocates no zeros.
        eager, model = pair("qwen3")
        kernel_hub.kernelize(model, device="cpu", mode="train")
        model.train()
        rt = model.kernel_hub_runtime.id
        ops = kernel_hub.ops
        g = torch.Generator().manual_seed(5)

        def leaf(*shape, dtype=torch.float32):
            return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()

        labels = torch.randint(0, 96, (24,), generator=g)
        q, k, v = leaf(2, 12, 4, 16), leaf(2, 12, 2, 16), leaf(2, 12, 2, 16)
        cos, sin = torch.randn(1, 12, 16, generator=g), torch.randn(1, 12, 16, generator=g)
        cases = {
            "FusedLinearCrossEntropy": lambda: ops.linear_cross_entropy_train(
                leaf(24, 64), leaf(96, 64), labels, -100, rt)[0],
            "RMSNorm": lambda: ops.rms_norm_train(leaf(24, 64), leaf(64), 1e-6, rt)[0].sum(),
            "CrossEntropy": lambda: ops.cross_entropy_train(leaf(24, 96), labels, -100,
                                                            rt)[0].sum(),
            "Attention": lambda: ops.attention(q, k, v, 1, -1, 0.25, rt)[0].sum(),
            "RotaryEmbedding (q only)": lambda: ops.rotary(leaf(2, 4, 12, 16),
                                                           leaf(2, 2, 12, 16), cos, sin,
                                                           rt)[0].sum(),
        }
        for name, forward in cases.items():
            out = forward()
            with torch.profiler.profile(profile_memory=True) as prof:
                out.backward()
            zeros = [e.cpu_memory_usage for e in prof.events()
                     if e.name == "aten::zeros" and e.cpu_memory_usage > 0]
            self.assertEqual(zeros, [], name)

    def test_silu_backward_overwrites_a_consumed_input(self):
        # consume_input=True (the bridge's MLP): the gradient is written over the saved input, no
        # [tokens, 2 * intermediate] allocation in backward; same gradient as the allocating
        # backward; a second backward through a retained graph raises.
        eager, model = pair("llama")
        kernel_hub.kernelize(model, device="cpu", mode="train")
        model.train()
        rt = model.kernel_hub_runtime.id
        g = torch.Generator().manual_seed(4)
        x0 = torch.randn(24, 2 * 96, generator=g)
        w = torch.randn(24, 96, generator=g)
        grads = {}
        for consume in (False, True):
            x = x0.clone().requires_grad_()
            h = x * 1.0  # an intermediate, as the gate/up buffer is
            out = (kernel_hub.ops.silu_and_mul(h, rt, consume) * w).sum()
            with torch.profiler.profile(profile_memory=True) as prof:
                out.backward(retain_graph=True)
            sized = [e.name for e in prof.events()
                     if e.name in ("aten::empty", "aten::empty_strided")  # the leaf allocators
                     and e.cpu_memory_usage == x0.numel() * 4]
            # The allocating backward allocates dx (x * 1.0 allocates inside aten::mul).
            self.assertEqual(len(sized), 0 if consume else 1, (consume, sized))
            grads[consume] = x.grad.clone()
            if consume:
                with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
                    out.backward()
            else:
                out.backward()  # retained: the saved input is intact
        torch.testing.assert_close(grads[True], grads[False], rtol=0, atol=0)
        hs = x0.clone().requires_grad_()
        ref = (torch.nn.functional.silu(hs[:, :96]) * hs[:, 96:] * w).sum()
        ref.backward()
        torch.testing.assert_close(grads[True], hs.grad, rtol=1e-5, atol=1e-6)

    def test_inference_mode_only(self):
        eager, model = pair("qwen3")
        kernel_hub.kernelize(model, device="cpu", mode="inference")
        rt = model.kernel_hub_runtime
        self.assertEqual(set(rt.bound["eval"]), ALL)
        self.assertEqual(rt.bound["train"], {})
        ids = self.ids(4)
        model.train()
        eager.train()
        with Calls() as calls:
            got = model(ids, labels=ids)
        self.assertEqual(sum(calls.values()), 0, calls)  # nothing bound for train: PyTorch
        torch.testing.assert_close(got.loss, eager(ids, labels=ids).loss)

    def test_padding_mask_falls_back_to_sdpa(self):
        eager, model = pair("qwen3")
        eager.set_attn_implementation("sdpa")
        kernel_hub.kernelize(model, device="cpu")
        ids = self.ids(5)
        mask = torch.ones_like(ids)
        mask[0, :3] = 0  # left padding: not what the kernel path takes
        eager.eval()
        model.eval()
        with torch.no_grad(), Calls() as calls:
            want = eager(ids, attention_mask=mask)
            got = model(ids, attention_mask=mask)
        self.assertNotIn(("Attention", "eval", "forward"), calls)
        self.assertIn(("RMSNorm", "eval", "forward"), calls)
        torch.testing.assert_close(got.logits[1], want.logits[1], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.logits[0, 3:], want.logits[0, 3:], rtol=1e-4, atol=1e-5)

    def test_only_equivalent_rms_norms_are_replaced(self):
        class ZeroCenteredRMSNorm(torch.nn.Module):  # Gemma's (1 + weight)
            def __init__(self, n):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.zeros(n))
                self.variance_epsilon = 1e-6

            def forward(self, x):
                v = x.pow(2).mean(-1, keepdim=True)
                return (1 + self.weight) * x * torch.rsqrt(v + self.variance_epsilon)

        _, model = pair("llama")
        model.model.norm = ZeroCenteredRMSNorm(64)
        kernel_hub.kernelize(model, device="cpu")
        self.assertIs(type(model.model.norm), ZeroCenteredRMSNorm)
        self.assertEqual(model.kernel_hub_replaced["RMSNorm"], 4)  # the decoder layers' only

    def test_errors_carry_the_status(self):
        _, model = pair("llama")
        with self.assertRaises(kernel_hub.KernelHubError) as cm:
            kernel_hub.kernelize(model, config={"RMSNorm": {"gpu": "kernel-hub/norm"}},
                                 device="cpu")
        self.assertEqual(cm.exception.status, "KH_ERR_INVALID_ARGUMENT")
        self.assertIn("gpu", str(cm.exception))
        with self.assertRaises(kernel_hub.KernelHubError) as cm:
            kernel_hub.kernelize(model, config={"RMSNorm": "kernel-hub/no-such-package"},
                                 device="cpu", strict=True)
        self.assertIn("no-such-package", str(cm.exception))
        with self.assertRaises(ValueError):
            kernel_hub.kernelize(model, device="cpu", mode="sometimes")

    def test_pull_lock_trust(self):
        trust = kernel_hub.trust_status("kernel-hub/norm@v1")
        self.assertEqual(trust["status"], "signed", trust)
        lock_path = os.path.join(self.tmp.name, "kernels.lock")
        summary = kernel_hub.lock({"RMSNorm": "kernel-hub/norm", "rotary_pos_emb":
                                   "kernel-hub/rotary"}, lock_path, targets=["cpu"])
        self.assertEqual(sorted(e["ref"] for e in summary["entries"]),
                         ["kernel-hub/norm@v1", "kernel-hub/rotary@v1"])
        pulled = kernel_hub.pull(lock=lock_path)
        self.assertTrue(pulled, pulled)
        # kernelize under the lock binds what it pins; a layer outside it cannot be served.
        eager, model = pair("qwen3")
        kernel_hub.kernelize(model, config={"RMSNorm": "kernel-hub/norm"}, device="cpu",
                             lock=lock_path)
        self.assertEqual(set(model.kernel_hub_runtime.bound["eval"]), {"RMSNorm"})
        with self.assertRaises(kernel_hub.KernelHubError):
            kernel_hub.kernelize(model, config={"SiluAndMul": "kernel-hub/activation"},
                                 device="cpu", lock=lock_path, strict=True)
        with self.assertRaises(kernel_hub.KernelHubError) as cm:
            kernel_hub.pull("kernel-hub/absent@v1")
        self.assertIn("absent", str(cm.exception))
        self.assertEqual(cm.exception.status, "not_found")


if __name__ == "__main__":
    unittest.main(verbosity=2)
