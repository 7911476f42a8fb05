"""Datasets with shared prefixes (multi-turn, shared system prompt) and ShareGPT's real answer lengths."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from loadgen.datasets import sample_prompts


async def count_words(text: str) -> int:
    return len(text.split())  # a stand-in tokenizer: one token per word


def test_multiturn_turns_extend_the_previous_turn() -> None:
    ps = asyncio.run(sample_prompts("multiturn:3", 12, (8, 20), (5, 9), 0, count_words)).prompts
    assert len(ps) == 12
    first, second, third = ps[0:4], ps[4:8], ps[8:12]  # turn by turn, 4 conversations
    for a, b, c in zip(first, second, third, strict=True):
        assert b.prompt.startswith(a.prompt) and c.prompt.startswith(b.prompt)
        assert a.prompt_len < b.prompt_len < c.prompt_len
        assert b.prompt_len == len(b.prompt.split()) and b.exact
    assert len({p.prompt[:50] for p in first}) == 4  # the conversations differ


def test_shared_system_prompt_is_a_common_prefix() -> None:
    ps = asyncio.run(sample_prompts("shared-system:64", 6, (8, 20), (5, 9), 1, count_words)).prompts
    prefix = ps[0].prompt.split("\n\n")[0]
    assert len(prefix.split()) == 64
    assert all(p.prompt.startswith(prefix + "\n\n") for p in ps)
    assert len({p.prompt for p in ps}) == 6
    assert all(64 + 8 <= p.prompt_len <= 64 + 20 for p in ps)


def test_sharegpt_uses_the_real_answer_lengths(tmp_path: Path) -> None:
    convs = [{"conversations": [{"from": "human", "value": " ".join(["q"] * (5 + i))},
                                {"from": "gpt", "value": " ".join(["a"] * (10 + 3 * i))}]}
             for i in range(10)]
    convs.append({"conversations": [{"from": "human", "value": "lonely"}]})
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    ps = asyncio.run(sample_prompts(f"sharegpt:{path}", 10, (4, 100), (1, 100), 0, count_words)).prompts
    assert sorted(p.output_len for p in ps) == [10 + 3 * i for i in range(10)]
    assert all(p.output_len == 10 + 3 * (p.prompt_len - 5) for p in ps)
