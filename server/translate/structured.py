"""From a request's constraint fields to the engine's StructuredOutputSpec.

Precedence, as vLLM: `response_format` (when not "text") wins over `structured_outputs`,
which wins over the older `guided_*` aliases. Within one of them exactly one kind may be
given. The engine compiles the spec before the request reaches it (engine_requests.py):
that fills its grammar cache, and an uncompilable spec is a 400 that says why.
"""

from __future__ import annotations

from typing import Any

from engine.structured_output import StructuredOutputSpec
from server.api.errors import bad_request
from server.api.protocol import ResponseFormat, StructuredFields, StructuredOutputsParams


def spec_from_request(body: StructuredFields) -> StructuredOutputSpec | None:
    if body.response_format is not None and body.response_format.type != "text":
        return spec_from_response_format(body.response_format)
    if body.structured_outputs is not None:
        return spec_from_structured_outputs(body.structured_outputs)
    return spec_from_guided(body)


def spec_from_response_format(fmt: ResponseFormat) -> StructuredOutputSpec:
    if fmt.type == "json_object":
        return StructuredOutputSpec.json_object()
    if fmt.type == "structural_tag":
        if fmt.format is None:
            raise bad_request("response_format of type structural_tag needs a format",
                              "response_format")
        # xgrammar (as vLLM passes it) takes the whole object, type included, not the format.
        return StructuredOutputSpec.structural_tag({"type": "structural_tag", "format": fmt.format})
    assert fmt.json_schema is not None  # checked by the model
    schema = fmt.json_schema.json_schema
    if schema is None:
        return StructuredOutputSpec.json_object()
    return StructuredOutputSpec.json_schema(schema)


def spec_from_structured_outputs(params: StructuredOutputsParams) -> StructuredOutputSpec:
    given = {name: value for name, value in (
        ("json", params.json_schema), ("regex", params.regex), ("choice", params.choice),
        ("grammar", params.grammar), ("json_object", params.json_object or None),
        ("structural_tag", params.structural_tag)) if value is not None}
    if len(given) != 1:
        raise bad_request("structured_outputs needs exactly one of json, regex, choice, grammar, "
                          f"json_object, structural_tag; got {sorted(given) or 'none'}",
                          "structured_outputs")
    if params.whitespace_pattern is not None:
        raise whitespace_pattern_refused("structured_outputs")
    any_ws = params.disable_any_whitespace is False
    (kind, value), = given.items()
    if kind == "json":
        schema = load_schema(value, "structured_outputs")
        if params.disable_additional_properties and isinstance(schema, dict):
            schema = close_objects(schema)
        return StructuredOutputSpec.json_schema(schema, any_ws)
    if kind == "json_object":
        return StructuredOutputSpec.json_object(any_ws)
    return build_simple(kind, value)


def whitespace_pattern_refused(param: str) -> Exception:
    """xgrammar compiles a JSON schema with any whitespace or none, never a pattern of it;
    accepting one would promise a whitespace the output does not keep to."""
    return bad_request("whitespace_pattern is not supported by this server; "
                       "disable_any_whitespace: false allows any whitespace", param)


def spec_from_guided(body: StructuredFields) -> StructuredOutputSpec | None:
    if body.guided_whitespace_pattern is not None:
        raise whitespace_pattern_refused("guided_whitespace_pattern")
    given = {name: value for name, value in (
        ("json", body.guided_json), ("regex", body.guided_regex),
        ("choice", body.guided_choice), ("grammar", body.guided_grammar)) if value is not None}
    if not given:
        return None
    if len(given) > 1:
        raise bad_request(f"give one guided_* field, not {sorted('guided_' + k for k in given)}",
                          "guided_" + sorted(given)[0])
    (kind, value), = given.items()
    if kind == "json":
        return StructuredOutputSpec.json_schema(load_schema(value, "guided_json"))
    return build_simple(kind, value)


def build_simple(kind: str, value: Any) -> StructuredOutputSpec:
    if kind == "regex":
        return StructuredOutputSpec.regex(value)
    if kind == "choice":
        if not value:
            raise bad_request("choice needs at least one string", "structured_outputs")
        return StructuredOutputSpec.choice(value)
    if kind == "grammar":
        return StructuredOutputSpec.grammar(value)
    return StructuredOutputSpec.structural_tag(value)


def load_schema(value: Any, param: str) -> dict[str, Any] | bool:
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except ValueError as exc:
            raise bad_request(f"the JSON schema is not valid JSON: {exc}", param) from exc
    if not isinstance(value, dict | bool):
        raise bad_request("a JSON schema must be an object", param)
    return value


def close_objects(schema: dict[str, Any]) -> dict[str, Any]:
    """additionalProperties: false on every object schema that does not say otherwise."""
    def visit(node: Any) -> Any:
        if isinstance(node, dict):
            node = {k: visit(v) for k, v in node.items()}
            if node.get("type") == "object" and "additionalProperties" not in node:
                node["additionalProperties"] = False
            return node
        if isinstance(node, list):
            return [visit(v) for v in node]
        return node
    return dict(visit(schema))

