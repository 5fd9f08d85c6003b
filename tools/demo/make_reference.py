#!/usr/bin/env python3
"""Generates tests/data/demo_reference/: tiny Transformers checkpoints and Transformers' own
outputs on them, which tests/unit/test_demo_model.cpp compares the demo model (tools/demo) with.

Run once by hand, NOT in CI (it needs torch and transformers; the outputs are committed):

    python3 -m venv /work/venv-ref && /work/venv-ref/bin/pip install torch transformers safetensors
    /work/venv-ref/bin/python tools/demo/make_reference.py tests/data/demo_reference

For each model it writes DIR/<model>/ as Transformers saves a checkpoint (config.json +
model.safetensors, or shards + model.safetensors.index.json) and, beside it,
DIR/<model>.reference.json (the token batch, the fp32 loss, the losses of a few AdamW steps,
the versions used) and DIR/<model>.logits.safetensors (fp32 logits [batch * seq, vocab]).

The models are random (seeded) with weights drawn at a scale where every part matters (norm
weights around 1 but not 1, biases non-zero, projections 1/sqrt(fan_in)), rounded to the
checkpoint's dtype first, so the fp32 model the reference runs is exactly what the file holds:
  qwen3  Qwen3ForCausalLM, GQA 4 q / 2 kv heads, head_dim 16 != hidden / heads, q/k norms, tied
         embeddings, rope_theta 500, stored as BF16 in one file;
  llama  LlamaForCausalLM, GQA 4 / 2, head_dim 8 (derived), untied, fp32 in 3 shards;
  qwen2  Qwen2ForCausalLM, GQA 4 / 1, q/k/v biases, untied, stored as F16 in one file.
"""
import copy
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file

BATCH, SEQ = 2, 12
# AdamW as the demo's adam_step implements it (torch.optim.AdamW's arithmetic).
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.1}
STEPS = 3

MODELS = {
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, torch.bfloat16, None, dict(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        rope_theta=500.0, tie_word_embeddings=True, max_position_embeddings=64)),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, torch.float32, "40KB", dict(
        vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, max_position_embeddings=64)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, torch.float16, None, dict(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, rms_norm_eps=1e-6, rope_theta=10000.0,
        tie_word_embeddings=False, max_position_embeddings=64)),
}


def randomize(model, dtype, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight"):
                v = 1.0 + 0.2 * r
            elif name.endswith(".bias"):
                v = 0.2 * r
            elif name.endswith("embed_tokens.weight") and not model.config.tie_word_embeddings:
                v = r
            else:
                v = r / math.sqrt(p.shape[-1])
            p.copy_(v.to(dtype).to(torch.float32))  # exactly representable in the checkpoint


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    gen = torch.Generator().manual_seed(20261130)
    for name, (config_cls, model_cls, dtype, shard, kwargs) in MODELS.items():
        config = config_cls(**kwargs, attn_implementation="eager")
        torch.manual_seed(0)
        model = model_cls(config).to(torch.float32)
        randomize(model, dtype, gen)
        ckpt = os.path.join(out_dir, name)
        saved = copy.deepcopy(model).to(dtype)
        if shard:
            saved.save_pretrained(ckpt, max_shard_size=shard)
        else:
            saved.save_pretrained(ckpt)

        V = config.vocab_size
        tokens = torch.randint(0, V, (BATCH, SEQ), generator=gen)
        targets = torch.randint(0, V, (BATCH, SEQ), generator=gen)
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=tokens).logits.float()
            loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)).item()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), **ADAMW)
        losses = []
        for _ in range(STEPS + 1):  # the loss before each step and after the last
            opt.zero_grad()
            lg = model(input_ids=tokens).logits
            step_loss = F.cross_entropy(lg.reshape(-1, V), targets.reshape(-1))
            losses.append(step_loss.item())
            if len(losses) <= STEPS:
                step_loss.backward()
                opt.step()

        save_file({"logits": logits.reshape(-1, V).contiguous()},
                  os.path.join(out_dir, f"{name}.logits.safetensors"))
        ref = {
            "model": name,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "batch": BATCH,
            "seq": SEQ,
            "tokens": tokens.reshape(-1).tolist(),
            "targets": targets.reshape(-1).tolist(),
            "loss": loss,
            "adamw": {"lr": ADAMW["lr"], "beta1": ADAMW["betas"][0], "beta2": ADAMW["betas"][1],
                      "eps": ADAMW["eps"], "weight_decay": ADAMW["weight_decay"]},
            "train_losses": losses,
        }
        with open(os.path.join(out_dir, f"{name}.reference.json"), "w") as f:
            json.dump(ref, f, indent=1)
            f.write("\n")
        print(name, "loss", loss, "train", losses, "files", sorted(os.listdir(ckpt)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/demo_reference")
