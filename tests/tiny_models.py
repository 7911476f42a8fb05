"""Small random-weight checkpoints saved as local Hugging Face folders."""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = 200


def save_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + [f"w{i}" for i in range(WORDS)])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>")
    tok.chat_template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    tok.save_pretrained(path)


def save_tiny_model(path: Path, arch: str = "llama", tie: bool = False) -> torch.nn.Module:
    """A 2-layer GQA model (4 query heads over 2 KV heads); Qwen2 adds Q/K/V bias."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=WORDS + 3, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=tie, rope_theta=5000.0,
                  initializer_range=0.2)
    torch.manual_seed(0)
    if arch == "qwen2":
        model: torch.nn.Module = Qwen2ForCausalLM(Qwen2Config(**common))
        with torch.no_grad():  # random biases, so a loader that drops them fails
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    model.save_pretrained(path)
    save_tokenizer(path)
    return model.eval()
