"""Random PEFT LoRA adapters over the tiny models, made by the real `peft` library, and their
transformers reference: the adapter merged into the base weights (`merge_and_unload`)."""

from __future__ import annotations

from pathlib import Path

import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_random_adapter(base: Path, out: Path, rank: int, seed: int, rslora: bool = False) -> torch.nn.Module:
    """Write a PEFT adapter of `rank` on every attention and MLP projection, with random
    non-zero A and B (PEFT's default B is zero: an adapter that changes nothing); returns
    transformers' base model with the adapter merged in, in fp32."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, lora_dropout=0.0,
                        use_rslora=rslora, init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3 / param.shape[-1] ** 0.5)
    peft_model.save_pretrained(str(out))
    merged = peft_model.merge_and_unload().eval()
    merged.generation_config.eos_token_id = None  # the engine runs with ignore_eos
    return merged
