"""vLLM's `bad_words` as token sequences, by vLLM's rule (SamplingParams.update_from_tokenizer):
each word encoded as it is (stripped on the left), and again after a space when that gives
another first token in as many tokens, so that the word is banned at the start of the text
and in its middle alike. The engine bans each sequence's last token where the output ends
with the rest (engine/bad_words.py)."""

from __future__ import annotations

from engine.tokenizer import Tokenizer


def bad_words_token_ids(words: list[str] | None, tokenizer: Tokenizer) -> list[list[int]]:
    sequences: list[list[int]] = []
    for word in words or []:
        bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        if not bare:
            continue
        sequences.append(bare)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            sequences.append(spaced)
    return sequences
