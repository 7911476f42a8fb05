"""Constrained decoding with xgrammar: a request may carry a StructuredOutputSpec (a JSON
schema, a regex, a list of choices, an EBNF grammar or a structural tag). The engine keeps
one matcher per constrained request, masks the logits of the constrained rows before
sampling, and advances each matcher on the tokens it accepts.

Interface for the engine (three calls): `StructuredOutputManager.new_state(spec)` at
add_request, `apply_masks(logits, states)` between the forward pass and sampling, and
`GrammarState.accept(token)` when a sampled token is appended.
"""

from engine.structured_output.compiler import GrammarCache, StructuredOutputError
from engine.structured_output.manager import StructuredOutputManager
from engine.structured_output.spec import StructuredOutputSpec
from engine.structured_output.state import GrammarState

__all__ = ["GrammarCache", "GrammarState", "StructuredOutputError", "StructuredOutputManager",
           "StructuredOutputSpec"]
