"""Incremental detokenization and stop strings.

Text is decoded over a sliding window of tokens (prefix_offset..), so a token
that completes a multi-byte character or a word-leading space comes out right;
text ending in U+FFFD waits for the next token. Streaming holds back enough text
that a partial stop string is never emitted.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_ids: list[int], stop: list[str],
                 skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-6:])  # context so the first token decodes right
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""  # all output text so far (stop string cut off once matched)
        self.emitted = 0  # chars of self.text already handed out
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1

    def add(self, token_id: int) -> None:
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
            self.text += full[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)

    def find_stop(self, num_new_chars: int) -> str | None:
        """Cut the text at the first stop string that the new characters complete."""
        if not self.stop:
            return None
        start = max(0, len(self.text) - num_new_chars - self.hold)
        best: tuple[int, str] | None = None
        for s in self.stop:
            at = self.text.find(s, start)
            if at != -1 and (best is None or at < best[0]):
                best = (at, s)
        if best is None:
            return None
        self.text = self.text[:best[0]]
        return best[1]

    def take_new_text(self, finished: bool) -> str:
        """Text safe to emit now: everything when finished, else all but the held-back tail."""
        end = len(self.text) if finished else max(self.emitted, len(self.text) - self.hold)
        new = self.text[self.emitted:end]
        self.emitted = end
        return new

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=self.skip_special,
                                         clean_up_tokenization_spaces=False))
