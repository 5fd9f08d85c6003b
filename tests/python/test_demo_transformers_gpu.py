#!/usr/bin/env python3
"""The GPU-resident runtime (tools/demo, DeviceCausalLM) against Transformers on a CUDA GPU (CTest
label gpu; the H200 run): small random Qwen3 (tied embeddings, q/k norms) and Llama models, head_dim
128, 3 layers, vocab 4096, saved as checkpoint directories (config.json + model.safetensors, fp32
weights) and run on the same 2 x 256 tokens by Transformers (fp32: the reference; bf16: the
tolerance) and by the runtime through tests/gpu/demo_logits (bf16 with the hub's packages serving
RMSNorm, RotaryEmbedding, SiluAndMul and Attention; bf16 with the runtime's own kernels only; fp32).
The runtime's bf16 error against the fp32 reference must be within a small multiple of
Transformers' own bf16 error, and its argmax must agree with the reference about as often as
Transformers' bf16 argmax does. Exit 77 (skipped) without torch, transformers or a CUDA device.

Usage: test_demo_transformers_gpu.py DEMO_LOGITS KERNEL_PACKAGES_DIR"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
    import torch
    import transformers
except ImportError as e:
    print(f"SKIPPED: needs numpy, torch and transformers ({e})")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIPPED: no CUDA device (torch.cuda.is_available() is False)")
    sys.exit(77)

TOOL, PACKAGES = sys.argv[1], sys.argv[2]
torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference is fp32 (as the runtime's)
torch.backends.cudnn.allow_tf32 = False
DEV = torch.device("cuda", 0)
BATCH, SEQ, VOCAB = 2, 256, 4096
# The runtime's bf16 error may be this many times Transformers' own (both round weights and
# activations to bf16, in different places: the runtime keeps the residual stream in bf16 as
# Transformers does, but fuses differently).
ERROR_FACTOR = 3.0


def build(family):
    common = dict(vocab_size=VOCAB, hidden_size=1024, intermediate_size=2048, num_hidden_layers=3,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=128,
                  max_position_embeddings=1024, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    if family == "qwen3":
        model = transformers.Qwen3ForCausalLM(
            transformers.Qwen3Config(tie_word_embeddings=True, **common))
    else:
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(tie_word_embeddings=False, **common))
    model.set_attn_implementation("sdpa")
    return model.eval()


def runtime_logits(ckpt, tokens_file, out_dir, dtype, packages):
    out = os.path.join(out_dir, f"logits-{dtype}-{'pk' if packages else 'own'}.f32")
    cmd = [TOOL, ckpt, tokens_file, str(BATCH), str(SEQ), out, "--dtype", dtype]
    if packages:
        cmd += ["--packages", PACKAGES]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}{p.stdout}")
    info = json.loads(p.stdout.strip().splitlines()[-1])
    logits = np.fromfile(out, dtype="<f4").reshape(BATCH * SEQ, VOCAB)
    return torch.from_numpy(logits).to(DEV), info


def errors(got, ref):
    d = (got - ref).abs()
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    return d.max().item(), d.mean().item(), agree


class RuntimeMatchesTransformers(unittest.TestCase):
    def check(self, family):
        model = build(family).to(DEV)
        g = torch.Generator(device=DEV).manual_seed(1)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), device=DEV, generator=g)
        with tempfile.TemporaryDirectory(prefix="kh-demo-parity-") as tmp:
            ckpt = os.path.join(tmp, family)
            model.save_pretrained(ckpt)  # the fp32 weights, before the bf16 cast below
            with torch.no_grad():
                ref = model(input_ids=ids).logits.float().reshape(BATCH * SEQ, VOCAB)
                bf16 = model.to(torch.bfloat16)(input_ids=ids).logits.float().reshape(
                    BATCH * SEQ, VOCAB)
            tf_max, tf_mean, tf_agree = errors(bf16, ref)
            print(f"\n[{family}] Transformers bf16 vs fp32: max {tf_max:.4f} mean {tf_mean:.5f} "
                  f"argmax {tf_agree:.3f}")
            self.assertTrue(os.path.exists(os.path.join(ckpt, "model.safetensors")),
                            os.listdir(ckpt))
            tokens_file = os.path.join(tmp, "tokens.i64")
            ids.cpu().numpy().astype("<i8").tofile(tokens_file)
            for dtype, packages in (("bf16", True), ("bf16", False), ("fp32", False)):
                with self.subTest(family=family, dtype=dtype, packages=packages):
                    got, info = runtime_logits(ckpt, tokens_file, tmp, dtype, packages)
                    mx, mean, agree = errors(got, ref)
                    print(f"[{family}] runtime {dtype} ({'packages' if packages else 'own kernels'}"
                          f"): max {mx:.4f} mean {mean:.5f} argmax {agree:.3f}; "
                          f"packages served {info['package_slots']}, refused "
                          f"{info['refused_slots']}")
                    if packages:  # head_dim 128 bf16: every bound slot from its package
                        for slot in ("RMSNorm", "RotaryEmbedding", "SiluAndMul", "Attention"):
                            self.assertIn(slot, info["package_slots"], info)
                    if dtype == "fp32":  # far closer than any bf16 run
                        self.assertLess(mean, tf_mean / 4, info)
                        self.assertGreaterEqual(agree, 0.99, info)
                        continue
                    self.assertLessEqual(mean, ERROR_FACTOR * tf_mean, info)
                    self.assertLessEqual(mx, ERROR_FACTOR * tf_max, info)
                    self.assertGreaterEqual(agree, min(tf_agree - 0.03, 0.95), info)

    def test_qwen3(self):
        self.check("qwen3")

    def test_llama(self):
        self.check("llama")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
