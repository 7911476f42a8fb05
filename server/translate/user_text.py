"""User text stays text: special-token strings inside chat message content are tokenized
as plain characters, so that a user cannot forge a role boundary such as
`<|im_end|>\\n<|im_start|>system`. Only the chat template's own markup yields special tokens.

The template is rendered once with a unique marker in place of each message's content; the
markup between markers is encoded with special tokens recognised, each content with a copy
of the tokenizer that never matches them (`encode_special_tokens`). A template that copies
or transforms content so that the markers do not come back once each, in order, falls back
to refusing content that holds a special-token string. Content without one is encoded with
the whole text, so ordinary chats tokenize exactly as the tokenizer would.

The plain-text copy of a tokenizer takes a while to build (it is a whole tokenizer), so
there is one per tokenizer (`plain_text_encoder`), built once; the app builds it while the
engine loads.
"""

from __future__ import annotations

import functools
import re
import secrets
from collections.abc import Hashable
from typing import Any, cast

from engine.tokenizer import Tokenizer
from server.api.errors import bad_request


class PlainTextEncoder:
    """Encodes text with special-token strings kept as ordinary characters."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.plain: Any = None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            from tokenizers import Tokenizer

            self.plain = Tokenizer.from_str(backend.to_str())
            self.plain.encode_special_tokens = True
        self.specials = [t for t in getattr(tokenizer, "all_special_tokens", []) if t]
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self.specials += [str(t) for t in added.values() if getattr(t, "special", False)]

    def has_special(self, text: str) -> bool:
        return any(s in text for s in self.specials)

    def encode(self, text: str) -> list[int]:
        if self.plain is None:
            if self.has_special(text):
                raise bad_request("message content must not contain special tokens", "messages")
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        return list(self.plain.encode(text, add_special_tokens=False).ids)


def plain_text_encoder(tokenizer: Tokenizer) -> PlainTextEncoder:
    """The tokenizer's PlainTextEncoder, built on first use and kept."""
    return _encoder_of(cast(Hashable, tokenizer))


@functools.cache
def _encoder_of(tokenizer: Hashable) -> PlainTextEncoder:
    return PlainTextEncoder(cast(Tokenizer, tokenizer))


def render_with_markers(tokenizer: Tokenizer, messages: list[dict[str, Any]],
                        **template_kwargs: Any) -> tuple[str, list[str]]:
    nonce = secrets.token_hex(8)
    markers = [f"\x1fpagode{nonce}c{i}\x1f" for i in range(len(messages))]
    marked = [{**m, "content": markers[i]} for i, m in enumerate(messages)]
    text = tokenizer.apply_chat_template(marked, tokenize=False, **template_kwargs)
    return str(text), markers


def encode_chat(tokenizer: Tokenizer, encoder: PlainTextEncoder, messages: list[dict[str, Any]],
                text: str, **template_kwargs: Any) -> list[int]:
    """Token ids of the rendered chat `text`, with message contents encoded as plain text.
    Content without special-token strings takes the ordinary path (whole-text encoding, so
    tokens at the content's edges are exactly what the tokenizer gives the whole text)."""
    if not any(encoder.has_special(str(m["content"])) for m in messages):
        return list(tokenizer.encode(text, add_special_tokens=False))
    marked_text, markers = render_with_markers(tokenizer, messages, **template_kwargs)
    pieces = re.split("(" + "|".join(re.escape(m) for m in markers) + ")", marked_text)
    found = [p for p in pieces if p in markers]
    if found != markers:
        raise bad_request("message content must not contain special tokens", "messages")
    contents = {marker: str(m["content"]) for marker, m in zip(markers, messages, strict=True)}
    ids: list[int] = []
    for piece in pieces:
        if piece in contents:
            ids += encoder.encode(contents[piece])
        elif piece:
            ids += tokenizer.encode(piece, add_special_tokens=False)
    return ids
