"""The part of a Hugging Face tokenizer that pagode calls, as a Protocol, so that the
server and the engine type what they use instead of `Any`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Tokenizer(Protocol):
    eos_token_id: int | None
    chat_template: str | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str: ...

    def apply_chat_template(self, conversation: list[dict[str, Any]],
                            **kwargs: Any) -> Any: ...

    def __call__(self, text: str, **kwargs: Any) -> Any: ...  # a BatchEncoding

    def __len__(self) -> int: ...
