"""Whether a chat template renders a system turn. Some refuse one (Gemma 2's raises "System
role not supported"), so the tool prompt the server writes for a template that knows no
tools goes at the head of the first user turn there instead, as llama.cpp's server does for
such templates (minja's system-role polyfill)."""

from __future__ import annotations

from engine.tokenizer import Tokenizer

PROBE = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
_takes_system: dict[str, bool] = {}


def takes_system_turn(tokenizer: Tokenizer) -> bool:
    """The template renders a system turn without raising; probed once per template."""
    template = str(getattr(tokenizer, "chat_template", "") or "")
    if template not in _takes_system:
        try:
            tokenizer.apply_chat_template(PROBE, tokenize=False, add_generation_prompt=True)
            _takes_system[template] = True
        except Exception:  # noqa: BLE001 - jinja raises whatever the template raises
            _takes_system[template] = False
    return _takes_system[template]


def fold_into_first_user(messages: list[dict[str, str]], text: str) -> list[dict[str, str]]:
    """`text` at the head of the first user turn (a new one first if there is none)."""
    for i, message in enumerate(messages):
        if message["role"] == "user":
            folded = dict(message, content=f"{text}\n\n{message['content']}".strip())
            return [*messages[:i], folded, *messages[i + 1:]]
    return [{"role": "user", "content": text}, *messages]
