"""Greedy generation with transformers, and the rule for an acceptable divergence."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

NEAR_TIE = 1e-3  # batched fp32 arithmetic may flip a choice only between near-equal logits


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """While transformers loads a GGUF model: its loader parses the file twice (for the
    config, then for the weights) and builds gguf-py's tensor-name map again for every
    submodule (hundreds of times), most of the seconds a reference takes to load. Both are
    read-only and depend on their arguments alone, so each is built once here; what
    transformers makes of them is unchanged."""
    import gguf

    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.cache(real_reader)  # type: ignore[misc, assignment]
    gguf.get_tensor_name_map = functools.cache(real_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_map  # type: ignore[misc, assignment]


@torch.inference_mode()
def reference_greedy(model: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int,
                     eos_id: int | None) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=eos_id, pad_token_id=eos_id)
    return out[0, len(prompt_ids):].tolist()


@torch.inference_mode()
def reference_greedy_batch(model: torch.nn.Module, prompts_ids: list[list[int]], max_new_tokens: int,
                           eos_id: int) -> list[list[int]]:
    """reference_greedy for many prompts in one left-padded generate: a quarter of the time of
    one call per prompt. The padding changes only the order of some sums, so a row could part
    from its unpadded run at a near tie, which assert_greedy_match accepts either way."""
    width = max(len(ids) for ids in prompts_ids)
    ids = torch.tensor([[eos_id] * (width - len(p)) + p for p in prompts_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts_ids])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos_id, pad_token_id=eos_id)
    rows = []
    for row in out[:, width:].tolist():
        ended = row.index(eos_id) + 1 if eos_id in row else len(row)  # what follows is padding
        rows.append(row[:ended])
    return rows


@torch.inference_mode()
def top2_gap(model: torch.nn.Module, ids: list[int]) -> float:
    logits = model(torch.tensor([ids])).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def assert_greedy_match(model: torch.nn.Module, prompt_ids: list[int], ours: list[int],
                        ref: list[int]) -> None:
    """Equal token for token, or diverging only where the reference itself is a near tie."""
    for k, (a, b) in enumerate(zip(ours, ref, strict=False)):
        if a == b:
            continue
        gap = top2_gap(model, prompt_ids + ref[:k])
        assert gap < NEAR_TIE, (f"divergence at output token {k}: ours {a}, reference {b}, "
                                f"reference top-2 logit gap {gap:.3g} (not a near tie)")
        print(f"accepted divergence at output token {k}: ours {a} vs reference {b}, gap {gap:.2g}")
        return
    assert len(ours) == len(ref), f"lengths differ: ours {len(ours)}, reference {len(ref)}"
