"""What a request asks its output to follow, in one canonical, hashable form.

The canonical text is the cache key of the compiled grammar: two requests with the same
schema share one compilation. Key order is kept, not sorted: a JSON schema's property order
is the order in which the output writes the properties.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

Kind = Literal["json", "json_object", "regex", "choice", "grammar", "structural_tag"]
KINDS: tuple[Kind, ...] = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


@dataclass(frozen=True)
class StructuredOutputSpec:
    kind: Kind
    text: str  # JSON schema / choices / structural tag as compact JSON; regex or grammar as is
    # False (the default) constrains JSON whitespace to single spaces after ',' and ':', as
    # vLLM's disable_any_whitespace does: a small model may otherwise emit newlines forever.
    any_whitespace: bool = False
    # Text the output writes freely before the grammar starts, ending with this marker: a
    # reasoning model's thinking is not held to the answer's format ("</think>"); "" for none.
    after: str = ""

    @property
    def key(self) -> tuple[str, str, bool, str]:
        return (self.kind, self.text, self.any_whitespace, self.after)

    def starting_after(self, marker: str) -> StructuredOutputSpec:
        """This spec, applied only once the output has written `marker`."""
        return replace(self, after=marker)

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str | bool, any_whitespace: bool = False
                    ) -> StructuredOutputSpec:
        value = json.loads(schema) if isinstance(schema, str) else schema
        return cls("json", canonical_json(value), any_whitespace)

    @classmethod
    def json_object(cls, any_whitespace: bool = False) -> StructuredOutputSpec:
        return cls("json_object", "", any_whitespace)

    @classmethod
    def regex(cls, pattern: str) -> StructuredOutputSpec:
        return cls("regex", pattern)

    @classmethod
    def choice(cls, choices: list[str]) -> StructuredOutputSpec:
        return cls("choice", canonical_json([str(c) for c in choices]))

    @classmethod
    def grammar(cls, ebnf: str) -> StructuredOutputSpec:
        return cls("grammar", ebnf)

    @classmethod
    def structural_tag(cls, tag: dict[str, Any] | str) -> StructuredOutputSpec:
        value = json.loads(tag) if isinstance(tag, str) else tag
        return cls("structural_tag", canonical_json(value))


def canonical_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
