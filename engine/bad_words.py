"""vLLM's `bad_words`, on token ids: a word is the token sequences it encodes to, and what
is banned at a step is the last token of each sequence whose other tokens the output ends
with (a one-token word is banned at every step). So a word never appears whole as one of
its sequences, while its first tokens, which other words share, stay free."""

from __future__ import annotations

from collections.abc import Sequence


def banned_now(words: Sequence[Sequence[int]], output: Sequence[int]) -> list[int]:
    """The tokens the next step may not take, given the output so far."""
    banned: list[int] = []
    for word in words:
        head = word[:-1]
        if not head or (len(output) >= len(head) and list(output[-len(head):]) == list(head)):
            banned.append(word[-1])
    return banned
