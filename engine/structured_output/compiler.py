"""Compiling specs into xgrammar grammars, behind an LRU cache keyed by the spec.

Compiling a large JSON schema takes milliseconds to seconds, so the server compiles a
request's spec in a worker thread before the request reaches the engine (a bad spec is a
400 then); the engine's own compile is a cache hit. One lock serialises compilations: the
server's threads and the engine's worker thread share the cache.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

from engine.structured_output.spec import StructuredOutputSpec
from engine.types.errors import InvalidRequestError

DEFAULT_CACHE_SIZE = 256
XGRAMMAR_LOG_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")


class StructuredOutputError(InvalidRequestError):
    """The spec cannot be compiled into a grammar (HTTP 400, with xgrammar's reason)."""


class GrammarCache:
    def __init__(self, tokenizer_info: Any, max_entries: int = DEFAULT_CACHE_SIZE,
                 max_threads: int = 2) -> None:
        import xgrammar as xgr

        self._compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=max_threads,
                                             cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str, bool, str], Any] = OrderedDict()
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def compile(self, spec: StructuredOutputSpec) -> Any:
        """The xgrammar CompiledGrammar of spec; raises StructuredOutputError."""
        with self._lock:
            compiled = self._cache.get(spec.key)
            if compiled is not None:
                self._cache.move_to_end(spec.key)
                self.hits += 1
                return compiled
            self.misses += 1
            compiled = self._compile_uncached(spec)
            self._cache[spec.key] = compiled
            if len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
            return compiled

    def __len__(self) -> int:
        return len(self._cache)

    def _compile_uncached(self, spec: StructuredOutputSpec) -> Any:
        try:
            compiled = compile_with(self._compiler, spec)
            if not can_begin(compiled):
                raise StructuredOutputError(
                    f"the {describe(spec)} matches no output: no token can begin one",
                    "structured_outputs")
            return compiled
        except StructuredOutputError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError with the reason
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            reason = XGRAMMAR_LOG_PREFIX.sub("", reason)  # a client has no use for its C++ source path
            raise StructuredOutputError(f"cannot compile the {describe(spec)}: {reason}",
                                        "structured_outputs") from exc


def compile_with(compiler: Any, spec: StructuredOutputSpec) -> Any:
    if spec.after:
        return compiler.compile_grammar(grammar_after(spec))
    ws = spec.any_whitespace
    if spec.kind == "json":
        return compiler.compile_json_schema(spec.text, any_whitespace=ws, strict_mode=True)
    if spec.kind == "json_object":
        return compiler.compile_json_schema('{"type": "object"}', any_whitespace=ws)
    if spec.kind == "regex":
        return compiler.compile_regex(spec.text)
    if spec.kind == "choice":
        return compiler.compile_grammar(choice_grammar(json.loads(spec.text)))
    if spec.kind == "grammar":
        return compiler.compile_grammar(spec.text)
    if spec.kind == "structural_tag":
        return compiler.compile_structural_tag(spec.text)
    raise StructuredOutputError(f"unknown structured output kind {spec.kind!r}",
                                "structured_outputs")


def can_begin(compiled: Any) -> bool:
    """Whether the grammar allows some first token (an end-of-output counts). xgrammar
    compiles an empty language, such as the regex `[^\\s\\S]`, without complaint, and its
    every-token-forbidden mask would reach the sampler: refused here, before any work."""
    import torch
    import xgrammar as xgr

    vocab_size = compiled.tokenizer_info.vocab_size
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    xgr.GrammarMatcher(compiled).fill_next_token_bitmask(bitmask)
    logits = torch.zeros(1, vocab_size)
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab_size)
    return bool(torch.isfinite(logits).any())


def grammar_after(spec: StructuredOutputSpec) -> Any:
    """Free text up to and including `spec.after`, then whitespace, then the spec's own
    grammar: xgrammar's any_text runs until its end tag, so the grammar takes over at the
    marker's first occurrence."""
    import xgrammar as xgr

    free = {"type": "structural_tag", "format": {"type": "tag", "begin": "",
                                                 "content": {"type": "any_text"},
                                                 "end": spec.after}}
    # The blank lines a template writes after the reasoning's end (Qwen3's "</think>\n\n")
    # are allowed before the grammar begins.
    return xgr.Grammar.concat(xgr.Grammar.from_structural_tag(json.dumps(free)),
                              xgr.Grammar.from_regex(r"[ \t\n]*"), own_grammar(spec))


def own_grammar(spec: StructuredOutputSpec) -> Any:
    """The spec's grammar as an xgrammar Grammar (not yet compiled), to compose with."""
    import xgrammar as xgr

    ws = spec.any_whitespace
    if spec.kind == "json":
        return xgr.Grammar.from_json_schema(spec.text, any_whitespace=ws, strict_mode=True)
    if spec.kind == "json_object":
        return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=ws)
    if spec.kind == "regex":
        return xgr.Grammar.from_regex(spec.text)
    if spec.kind == "choice":
        return xgr.Grammar.from_ebnf(choice_grammar(json.loads(spec.text)))
    if spec.kind == "grammar":
        return xgr.Grammar.from_ebnf(spec.text)
    if spec.kind == "structural_tag":
        return xgr.Grammar.from_structural_tag(spec.text)
    raise StructuredOutputError(f"unknown structured output kind {spec.kind!r}",
                                "structured_outputs")


def choice_grammar(choices: list[str]) -> str:
    """EBNF whose language is exactly the given strings."""
    if not choices:
        raise StructuredOutputError("choice needs at least one string", "structured_outputs")
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def describe(spec: StructuredOutputSpec) -> str:
    return {"json": "JSON schema", "json_object": "JSON object grammar", "regex": "regex",
            "choice": "choice list", "grammar": "grammar",
            "structural_tag": "structural tag"}[spec.kind]
