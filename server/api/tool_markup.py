"""The markup a model writes around a tool call, and the modes a request may ask for.

translate/tool_prompt.py writes it into the prompt (for a chat template that knows no
tools: llama-server's "generic" form, Hermes' `<tool_call>` blocks) and forces calls with a
grammar; respond/tool_calls.py reads it back out of the output. Both sides read it here.
"""

from __future__ import annotations

from typing import Literal

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
Mode = Literal["auto", "required", "named"]
