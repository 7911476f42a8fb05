"""How each served family chats: its chat template (tests/chat_templates/), its BOS and EOS,
the tool-call parser a vLLM user names for it, and the reply that parser reads as a call.

Each family's tiny checkpoint is the one its equality test builds (same config, same
features), given the byte-level chat tokenizer (tests/chat_tokenizer.py) and positions
enough for a prompt written mostly a byte per token.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from chat_tokenizer import CHAT_VOCAB, token_id
from test_families import SPECS
from test_moe_family import MIXTRAL, OLMOE, QWEN3_MOE
from test_window_models import GEMMA2, GEMMA3
from tiny_models import TinySpec

TEMPLATES = Path(__file__).with_name("chat_templates")
QWEN3_TEMPLATE = Path(__file__).with_name("qwen3_template.jinja")
MAX_POSITIONS = 2048  # mostly a token per byte: a prompt with tools is about a thousand
CITY = {"city": "Paris"}
CALL_JSON = json.dumps({"name": "get_weather", "arguments": CITY})
THOUGHT = "\nI call get_weather.\n"
HERMES_CALL = f"<tool_call>\n{CALL_JSON}\n</tool_call>"


@dataclass(frozen=True)
class FamilyChat:
    family: str  # the model_type a family registers (engine/model/registry.py)
    spec: TinySpec  # the family's tiny checkpoint, as its equality test builds it
    template: Path
    bos: str
    eos: str
    turn: str  # a special token every rendered prompt holds (the family's turn marker)
    tool_parser: str  # --tool-call-parser
    call: str  # a reply in the family's call format, calling get_weather(city=Paris)
    result: str  # how the template writes the tool result "sunny" back into the prompt
    reasoning: bool = False  # the template writes <think>: the reply reasons first

    @property
    def chat_spec(self) -> TinySpec:
        overrides = {**self.spec.overrides, "vocab_size": CHAT_VOCAB,
                     "max_position_embeddings": MAX_POSITIONS,
                     "bos_token_id": token_id(self.bos), "eos_token_id": token_id(self.eos)}
        return dataclasses.replace(self.spec, name=f"{self.spec.name}-chat", gguf_arch=None,
                                   overrides_json=json.dumps(overrides, sort_keys=True), gguf_meta=(),
                                   chat=(str(self.template), self.bos, self.eos))

    @property
    def reply(self) -> str:
        """The forced reply: the call, after a think block where the family reasons."""
        return f"<think>{THOUGHT}</think>\n\n{self.call}" if self.reasoning else self.call


def spec_named(name: str) -> TinySpec:
    return next(s for s in SPECS if s.name == name)


CHATML_RESULT = "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>"
FAMILIES = [
    FamilyChat("llama", spec_named("llama"), TEMPLATES / "llama3_json.jinja", "<|begin_of_text|>",
               "<|eot_id|>", "<|start_header_id|>", "llama3_json",
               json.dumps({"name": "get_weather", "parameters": CITY}),
               '<|start_header_id|>ipython<|end_header_id|>\n\n{"output": "sunny"}<|eot_id|>'),
    FamilyChat("mistral", spec_named("mistral"), TEMPLATES / "mistral.jinja", "<s>", "</s>", "[INST]",
               "mistral", f"[TOOL_CALLS] [{CALL_JSON}]", '[TOOL_RESULTS] {"content": "sunny", "call_id": "'),
    FamilyChat("qwen2", spec_named("qwen2"), TEMPLATES / "qwen2_5.jinja", "<|endoftext|>", "<|im_end|>",
               "<|im_start|>", "hermes", HERMES_CALL, CHATML_RESULT),
    FamilyChat("qwen3", spec_named("qwen3"), QWEN3_TEMPLATE, "<|endoftext|>", "<|im_end|>", "<|im_start|>",
               "hermes", HERMES_CALL, CHATML_RESULT, reasoning=True),
    FamilyChat("phi3", spec_named("phi3-short"), TEMPLATES / "phi4_mini.jinja", "<|endoftext|>", "<|end|>",
               "<|user|>", "phi4_mini_json", f"functools[{CALL_JSON}]", "<|tool|>sunny<|end|>"),
    FamilyChat("granite", spec_named("granite"), TEMPLATES / "granite.jinja", "<|end_of_text|>",
               "<|end_of_text|>", "<|start_of_role|>", "granite", f"<|tool_call|>[{CALL_JSON}]",
               "<|start_of_role|>tool_response<|end_of_role|>sunny<|end_of_text|>"),
    FamilyChat("olmo2", spec_named("olmo2"), TEMPLATES / "tulu.jinja", "<|endoftext|>", "<|endoftext|>",
               "<|user|>", "hermes", HERMES_CALL, "<|user|>\n<tool_response>\nsunny\n</tool_response>\n"),
    FamilyChat("smollm3", spec_named("smollm3"), TEMPLATES / "smollm3.jinja", "<|im_start|>", "<|im_end|>",
               "<|im_start|>", "hermes", HERMES_CALL, CHATML_RESULT, reasoning=True),
    FamilyChat("qwen3_moe", QWEN3_MOE, QWEN3_TEMPLATE, "<|endoftext|>", "<|im_end|>", "<|im_start|>",
               "hermes", HERMES_CALL, CHATML_RESULT, reasoning=True),
    FamilyChat("olmoe", OLMOE, TEMPLATES / "tulu.jinja", "<|endoftext|>", "<|endoftext|>", "<|user|>",
               "hermes", HERMES_CALL, "<|user|>\n<tool_response>\nsunny\n</tool_response>\n"),
    FamilyChat("mixtral", MIXTRAL, TEMPLATES / "mistral.jinja", "<s>", "</s>", "[INST]", "mistral",
               f"[TOOL_CALLS] [{CALL_JSON}]", '[TOOL_RESULTS] {"content": "sunny", "call_id": "'),
    FamilyChat("gemma2", GEMMA2, TEMPLATES / "gemma2.jinja", "<bos>", "<eos>", "<start_of_turn>", "hermes",
               HERMES_CALL, "<start_of_turn>user\n<tool_response>\nsunny\n</tool_response><end_of_turn>"),
    FamilyChat("gemma3", GEMMA3, TEMPLATES / "gemma3_pythonic.jinja", "<bos>", "<eos>", "<start_of_turn>",
               "pythonic", '[get_weather(city="Paris")]',
               "<start_of_turn>user\n<tool_response>\nsunny</tool_response><end_of_turn>"),
]
