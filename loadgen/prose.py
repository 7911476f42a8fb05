"""The prose that text prompts are cut from: by default the English documentation that
Python ships with itself (pydoc_data), so a run needs no download.

`prose_token_ids` serves offline callers that hold a tokenizer (the benchmarks, the tests):
spans of that text of exact token lengths.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path


def extract_prose(text: str, min_words: int = 12) -> str:
    """The running prose of a document: paragraphs of words, without code or headings."""
    kept = []
    for para in re.split(r"\n\s*\n", text):
        lines = para.split("\n")
        if any(line[:1].isspace() for line in lines if line):
            continue  # indented: code, grammar or a table
        words = para.split()
        letters = sum(ch.isalpha() for ch in para)
        if len(words) >= min_words and letters > 0.7 * len(para.replace(" ", "").replace("\n", "")):
            kept.append(" ".join(words))
    return " ".join(kept)


def default_prose() -> str:
    """The English documentation Python ships with itself."""
    from pydoc_data.topics import topics

    return extract_prose("\n\n".join(topics[key] for key in sorted(topics)))


def load_words(path: str | None) -> list[str]:
    text = default_prose() if path is None else Path(path).read_text(encoding="utf-8")
    words = text.split()
    if len(words) < 1000:
        raise ValueError(f"text dataset too small: {len(words)} words")
    return words


def prose_token_ids(tokenize: Callable[[str], Sequence[int]], lengths: Sequence[int],
                    seed: int) -> list[list[int]]:
    """Spans of real prose (Python's documentation, code included) of exact token lengths,
    at seeded offsets; `tokenize` is the model's own (e.g. `LLM(...).engine.tokenize`)."""
    from pydoc_data.topics import topics

    text = "\n".join(topics[k] for k in sorted(topics))
    ids = list(tokenize(text[:400_000]))
    rng = random.Random(seed)
    return [ids[(s := rng.randrange(len(ids) - n)):s + n] for n in lengths]
