#!/usr/bin/env python3
"""The kernel_hub package on a CUDA GPU (CTest label gpu; the H200 run): small Qwen3 and Llama
models in bf16, kernelized with the hub's cuda packages against eager copies: logits, loss and
gradients within bf16 tolerance, every layer served by its kernel (calls counted), train/eval
swap, torch.compile(fullgraph=True), and a CUDA graph of the kernelized eval forward whose replay
equals eager. Also the peak memory of one training step of a 4-layer Qwen3-0.6B-shaped model
(vocab 151936) kernelized against the same model with Liger-Kernel's equivalents (RoPE, RMSNorm,
SwiGLU, fused linear cross-entropy), each in its own process (Liger patches Transformers' classes
globally), when liger_kernel imports (from PYTHONPATH, or $KH_LIGER_DIR, default /tmp/liger, where
tools/bench/bench_e2e.py installs it; that comparison skips otherwise). Exit 77 (skipped) without torch, transformers or a CUDA device.

Usage: test_torch_bridge_gpu.py (KERNEL_HUB_LIBRARY, KERNEL_HUB_CLI and PYTHONPATH as CTest
sets them); test_torch_bridge_gpu.py --peak-memory kh|liger measures one configuration and prints
a PEAK line (the test's child processes)."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import torch
    import transformers
except ImportError as e:
    print(f"SKIPPED: needs torch and transformers ({e})")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIPPED: no CUDA device (torch.cuda.is_available() is False)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Liger for the peak-memory comparison: importable as is, or where bench_e2e.py installs its wheel
# (--liger-dir, default /tmp/liger; CTest's PYTHONPATH does not name it).
LIGER_DIR = os.environ.get("KH_LIGER_DIR", "/tmp/liger")
if os.path.isdir(os.path.join(LIGER_DIR, "liger_kernel")):
    sys.path.append(LIGER_DIR)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "python"))
import kernel_hub  # noqa: E402
from test_torch_bridge import ALL, EVAL_CALLED, TRAIN_CALLED, Calls, layers_called  # noqa: E402

DEV = torch.device("cuda", 0)
BATCH, SEQ = 2, 256


def tiny(family):
    common = dict(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024)
    if family == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=64, **common))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))


def pair(family):
    torch.manual_seed(0)
    eager = tiny(family).to(DEV, torch.bfloat16)
    eager.set_attn_implementation("sdpa")
    model = tiny(family).to(DEV, torch.bfloat16)
    model.load_state_dict(eager.state_dict())
    return eager, model


def close_grads(test, eager, model):
    """bf16 gradients of two implementations: relative error of each parameter's gradient."""
    for (name, p), (_, q) in zip(eager.named_parameters(), model.named_parameters()):
        err = (q.grad.float() - p.grad.float()).norm() / p.grad.float().norm().clamp_min(1e-6)
        test.assertLess(err.item(), 5e-2, name)


class GpuBridgeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        os.environ["KERNEL_HUB_CACHE"] = os.path.join(cls.tmp.name, "cache")
        # Inductor's caches of this run only: AOTAutograd's cache is keyed by the traced forward,
        # so a warm cache from an older kernel_hub could replay that version's backward.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cls.tmp.name, "inductor")

    def ids(self):
        g = torch.Generator().manual_seed(1)
        return torch.randint(0, 4096, (BATCH, SEQ), generator=g).to(DEV)

    def check(self, family):
        eager, model = pair(family)
        kernel_hub.kernelize(model)  # device: the parameters' (cuda:0)
        rt = model.kernel_hub_runtime
        self.assertEqual(set(rt.bound["eval"]), ALL, rt.report)
        self.assertEqual(set(rt.bound["train"]), ALL, rt.report)
        ids = self.ids()
        eager.eval()
        model.eval()
        with torch.no_grad(), Calls() as calls:
            want, got = eager(ids, labels=ids), model(ids, labels=ids)
        torch.testing.assert_close(got.logits, want.logits, rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-2, atol=1e-2)
        self.assertEqual(layers_called(calls, "eval"), EVAL_CALLED, calls)
        eager.train()
        model.train()
        with Calls() as calls:
            got = model(ids, labels=ids)
            got.loss.backward()
        want = eager(ids, labels=ids)
        want.loss.backward()
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-2, atol=1e-2)
        self.assertEqual(layers_called(calls, "train", "backward"), TRAIN_CALLED, calls)
        close_grads(self, eager, model)
        return eager, model

    def test_qwen3(self):
        self.check("qwen3")

    def test_llama(self):
        self.check("llama")

    def test_compile_fullgraph(self):
        eager, model = pair("qwen3")
        kernel_hub.kernelize(model)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        ids = self.ids()
        eager.train()
        compiled.train()
        got = compiled(ids, labels=ids)
        got.loss.backward()
        want = eager(ids, labels=ids)
        want.loss.backward()
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-2, atol=1e-2)
        close_grads(self, eager, model)

    def test_cuda_graph_replay(self):
        eager, model = pair("llama")
        kernel_hub.kernelize(model)
        rt = model.kernel_hub_runtime
        eager.eval()
        model.eval()
        ids = self.ids()
        static_ids = ids.clone()
        with torch.no_grad():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # warm-up: device code compiled and loaded before capture
                for _ in range(2):
                    model(static_ids)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            rt.set_capturing(True)
            try:
                with Calls() as calls, torch.cuda.graph(graph):
                    static_out = model(static_ids).logits
                with self.assertRaises(kernel_hub.KernelHubError):
                    rt.set_mode("train")  # refused during a capture
            finally:
                rt.set_capturing(False)
            self.assertEqual(layers_called(calls, "eval"), EVAL_CALLED - {"CrossEntropy"}, calls)
            other = torch.randint(0, 4096, ids.shape, device=DEV)
            static_ids.copy_(other)
            graph.replay()
            torch.cuda.synchronize()
            want = eager(other).logits
        torch.testing.assert_close(static_out, want, rtol=3e-2, atol=3e-2)


# The peak-memory comparison: Qwen3-0.6B's layer and head shapes, 4 layers, 4 x 1024 tokens.
PEAK_BATCH, PEAK_SEQ, PEAK_LAYERS = 4, 1024, 4
# kernel-hub may use at most this much more than Liger (allocator rounding); the fused loss's
# logits chunk runs with an 80 MiB budget here (256 rows at this vocab) so that the comparison is
# about what each layer keeps. Everything else must be at most Liger's.
PEAK_MARGIN = 96 << 20


def peak_memory(which):
    """Peak torch.cuda.max_memory_allocated of one training step (forward, backward, fused AdamW
    step) after a warm-up step, for `which` (kh or liger); also the forward's peak and what the
    forward leaves for backward, to tell where a difference comes from."""
    if which == "liger":
        import liger_kernel.transformers as lk
        lk.apply_liger_kernel_to_qwen3(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                       fused_linear_cross_entropy=True)
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        hidden_size=1024, num_hidden_layers=PEAK_LAYERS, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
        max_position_embeddings=4096, tie_word_embeddings=True, attn_implementation="sdpa")
    with torch.device(DEV):
        model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.train()
    if which == "kh":
        kernel_hub.kernelize(model, mode="train")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator(device=DEV).manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (PEAK_BATCH, PEAK_SEQ), device=DEV, generator=g)
    out = {}
    for step in range(2):  # the first allocates the optimizer's state
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = model(input_ids=ids, labels=ids).loss
        torch.cuda.synchronize()
        out["forward_peak"] = torch.cuda.max_memory_allocated() - base
        out["saved_for_backward"] = torch.cuda.memory_allocated() - base
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        out["step_peak"] = torch.cuda.max_memory_allocated()
        out["loss"] = float(loss.detach())
        del loss
    return out


@unittest.skipUnless(importlib.util.find_spec("liger_kernel"),
                     f"liger_kernel does not import (nor from {LIGER_DIR}: see bench_e2e.py)")
class PeakMemoryTest(unittest.TestCase):
    def measure(self, which):
        env = dict(os.environ, KERNEL_HUB_CACHE=os.path.join(self.tmp.name, "cache"),
                   KERNEL_HUB_LCE_CHUNK_MIB="80")
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--peak-memory", which],
                           env=env, capture_output=True, text=True, timeout=600)
        lines = [x for x in p.stdout.splitlines() if x.startswith("PEAK ")]
        self.assertTrue(p.returncode == 0 and lines, f"{which}: exit {p.returncode}\n"
                        f"{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        return json.loads(lines[-1][len("PEAK "):])

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def test_peak_memory_at_most_liger(self):
        kh, liger = self.measure("kh"), self.measure("liger")
        mib = lambda b: f"{b / 2**20:.0f} MiB"  # noqa: E731
        for name in ("step_peak", "forward_peak", "saved_for_backward"):
            print(f"{name}: kernel-hub {mib(kh[name])}, Liger {mib(liger[name])}, difference "
                  f"{mib(kh[name] - liger[name])}", file=sys.stderr)
        self.assertAlmostEqual(kh["loss"], liger["loss"], delta=0.05 * liger["loss"])
        self.assertLessEqual(kh["step_peak"], liger["step_peak"] + PEAK_MARGIN,
                             f"kernel-hub {mib(kh['step_peak'])} vs Liger {mib(liger['step_peak'])}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--peak-memory":
        print("PEAK " + json.dumps(peak_memory(sys.argv[2])), flush=True)
        sys.exit(0)
    unittest.main(verbosity=2)
