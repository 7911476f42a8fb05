"""Server-side options (the engine's own knobs, per-request caps included, live in
engine.config.EngineConfig).

Each option that `pagode serve` takes says so in its field's metadata (`option`): its help
text, its flag's group, whether it must be positive or non-negative, and where its default
comes from when that is not the field's own. The flags (`add_flags`) and the validation
(`__post_init__`) are both read from that metadata, so an option is described once.
A flag is the field's name with dashes, less a trailing `_s` (seconds): `header_timeout_s`
is `--header-timeout`.
"""

from __future__ import annotations

import argparse
import re
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from engine import envs

# The formats server/respond/tool_parsers/ and server/respond/reasoning/ register (a test
# holds these lists to the registries; settings import no other part of the server).
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json", "mistral", "phi4_mini_json", "granite", "pythonic")
REASONING_PARSERS = ("auto", "none", "qwen3", "deepseek_r1")
METRICS_COMPAT = ("vllm", "none")
JINJA_MARKS = ("{{", "{%")
POSITIVE = "positive"
NON_NEGATIVE = "non-negative"
FACTORY_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def option(default: Any, help: str, *, group: str = "server", bound: str | None = None,
           metavar: str | None = None, env: envs.EnvVar[Any] | None = None) -> Any:
    """A field that is also a `pagode serve` flag; `env` gives the flag's default."""
    return field(default=default, metadata={"help": help, "group": group, "bound": bound,
                                            "metavar": metavar, "env": env})


@dataclass
class ServerSettings:
    served_model_name: str | None = option(
        None, "the model name clients send and /v1/models lists (default: the engine's model name)")
    api_key: str | None = option(
        None, "require 'Authorization: Bearer KEY' (or Anthropic's 'x-api-key: KEY') on /v1/*, "
        "/tokenize, /detokenize, "
        "/reset_prefix_cache and /stats/stream; /health, /metrics and the web page at / stay open (default: "
        "$PAGODE_API_KEY, else no authentication)",
        env=envs.API_KEY)
    max_num_queued_reqs: int | None = option(
        None, "most requests waiting for their first token; past it the server answers 429 with "
        "Retry-After at once (default: the KV capacity in requests of 128 tokens, at least 8)",
        bound=NON_NEGATIVE)
    shutdown_timeout: float = option(
        30.0, "on SIGTERM, seconds to let in-flight requests finish before aborting them "
        "(finish_reason 'abort')", bound=NON_NEGATIVE)
    enable_lora_runtime_updates: bool = option(
        False, "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter, vLLM's routes for "
        "loading and unloading LoRA adapters while serving (default: $VLLM_ALLOW_RUNTIME_LORA_UPDATING, "
        "else off)")
    no_ui: bool = option(
        False, "do not serve the web page at / (chat playground and live view); the stats "
        "stream (/stats/stream) stays")
    log_requests_text: bool = option(
        False, "also log prompt and output text in each request's log line (off: only ids, token "
        "counts and timings are logged)")
    profile_steps: int = option(
        0, "log a table of where the time of N engine steps goes (packing, forward by op class, "
        "sampling, detokenize, streaming), then every N", metavar="N")
    metrics_compat: str = option(
        "vllm", "also publish vLLM's names of the series that fleet routers, autoscalers and "
        "Prometheus adapters read (vllm:num_requests_waiting, vllm:kv_cache_usage_perc, ...), fed by "
        "the same numbers as pagode's own; none: pagode: series only (docs/deploy.md)", metavar="NAME")
    engine_factory: str | None = option(
        None, "build the engine with MODULE:CALLABLE, called with the EngineConfig, instead of "
        "engine.async_engine:AsyncEngine (a custom engine, or a test double)",
        metavar="MODULE:CALLABLE")
    # How chats are rendered and read back (server/respond/chat_format.py)
    chat_template: str | None = option(
        None, "a Jinja chat template, as a file or inline text, to use instead of the model's "
        "own (default: the model's, from tokenizer_config.json or the GGUF)", group="chat",
        metavar="FILE|TEMPLATE")
    tool_call_parser: str = option(
        "auto", "how the model writes tool calls: hermes, llama3_json, mistral, phi4_mini_json, "
        "granite, pythonic, or auto: picked from the chat template's text (docs/server.md)", group="chat",
        metavar="NAME")
    reasoning_parser: str = option(
        "auto", "how the model writes its reasoning, split into the message's reasoning and "
        "reasoning_content: qwen3, deepseek_r1, none, or auto: qwen3 or deepseek_r1 when the "
        "chat template writes <think>, else none", group="chat", metavar="NAME")
    enable_auto_tool_choice: bool = option(
        False, "taken as vLLM takes it, so that vLLM's command lines run unchanged: tool_choice "
        "'auto' is always on here, its calls read by --tool-call-parser", group="chat")
    structured_outputs_in_reasoning: bool = option(
        False, "apply structured outputs (response_format, structured_outputs, forced tool "
        "calls) to the reasoning too; by default they start once the reasoning has ended",
        group="chat")
    # Slow and hostile clients (server/middleware/http_limits.py, server/api/body.py)
    default_max_tokens: int | None = option(
        None, "the output limit of a chat, messages or responses request that sets none "
        "(agents such as Codex CLI send none), as vLLM's --override-generation-config max_new_tokens (default: "
        "whatever the context leaves)", bound=POSITIVE)
    responses_store: str | None = option(
        None, "the SQLite file that keeps stored Responses API responses (store, "
        "previous_response_id, GET /v1/responses/ID) across restarts (default: "
        "$PAGODE_CACHE_DIR/responses.sqlite)", metavar="FILE")
    responses_store_max: int = option(
        10000, "most stored responses; past it the oldest are dropped", bound=POSITIVE)
    max_body_bytes: int = option(4 * 2**20, "largest request body; past it 413",
                                 group="connection limits", bound=POSITIVE)
    max_header_bytes: int = option(16 * 2**10, "largest request header block; past it 431",
                                   group="connection limits", bound=POSITIVE)
    header_timeout_s: float = option(10.0, "seconds a connection has to send a whole request head",
                                     group="connection limits", bound=POSITIVE)
    body_timeout_s: float = option(30.0, "seconds a request has to send its whole body (408)",
                                   group="connection limits", bound=POSITIVE)
    sse_send_timeout_s: float = option(
        30.0, "seconds a stream may wait for a client that stopped reading; then it is cut and its "
        "request aborted", group="connection limits", bound=POSITIVE)
    limit_concurrency: int = option(1024, "most open connections and tasks; past it 503",
                                    group="connection limits", bound=POSITIVE)
    timeout_keep_alive_s: float = option(5.0, "seconds an idle keep-alive connection stays open",
                                         group="connection limits", bound=POSITIVE)
    retry_after_s: int = 1  # Retry-After on 429 and 503
    chat_template_text: str | None = None  # what --chat-template names, read at start-up
    url: str | None = None  # where it listens, for the startup log line
    cors: dict[str, object] = field(default_factory=dict)  # CORSMiddleware's arguments; {}: off

    def responses_store_path(self) -> Path:
        if self.responses_store is not None:
            return Path(self.responses_store)
        return envs.CACHE_DIR.get() / "responses.sqlite"

    def __post_init__(self) -> None:
        self.api_key = self.api_key or None
        for item in fields(self):
            check_bound(item.name, getattr(self, item.name), item.metadata.get("bound"))
        if self.engine_factory is not None and not FACTORY_SPEC.fullmatch(self.engine_factory):
            raise ValueError(f"engine_factory must be MODULE:CALLABLE, got {self.engine_factory!r}")
        check_choice("tool_call_parser", self.tool_call_parser, TOOL_CALL_PARSERS)
        check_choice("reasoning_parser", self.reasoning_parser, REASONING_PARSERS)
        check_choice("metrics_compat", self.metrics_compat, METRICS_COMPAT)
        if self.chat_template is not None and self.chat_template_text is None:
            self.chat_template_text = read_chat_template(self.chat_template)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def read_chat_template(value: str) -> str:
    """`--chat-template`: a file, or the template's text inline (as vLLM takes either).
    ValueError for a path that names no file, or a template that does not parse, so that
    the server refuses to start rather than fail every chat."""
    if not any(mark in value for mark in JINJA_MARKS):
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"--chat-template {value!r}: no such file, and not a Jinja template")
        value = path.read_text(encoding="utf-8")
    check_template_syntax(value)
    return value


def check_template_syntax(text: str) -> None:
    """Parse in the environment transformers renders in (sandboxed, loop controls)."""
    from jinja2 import TemplateSyntaxError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment(extensions=[loopcontrols]).parse(text)
    except TemplateSyntaxError as exc:
        raise ValueError(f"the chat template does not parse: {exc.message} (line {exc.lineno})") \
            from exc


def check_bound(name: str, value: Any, bound: str | None) -> None:
    if bound is None or value is None:
        return
    if (bound == POSITIVE and value <= 0) or (bound == NON_NEGATIVE and value < 0):
        raise ValueError(f"{name} must be {bound}")


def flag_fields() -> list[Any]:
    """The fields that are flags, in their order."""
    return [item for item in fields(ServerSettings) if "help" in item.metadata]


def flag_name(name: str) -> str:
    return "--" + name.removesuffix("_s").replace("_", "-")


def value_type(name: str) -> type:
    """The field's type, without its `| None`."""
    hint = typing.get_type_hints(ServerSettings)[name]
    kinds = [kind for kind in typing.get_args(hint) if kind is not type(None)] or [hint]
    return typing.cast(type, kinds[0])


def add_flags(parser: argparse.ArgumentParser) -> dict[str, argparse._ArgumentGroup]:
    """One flag per option, in its group; returns the groups, by title, so that a command
    may add its own flags to them."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for item in flag_fields():
        meta = item.metadata
        if meta["group"] not in groups:
            groups[meta["group"]] = parser.add_argument_group(meta["group"])
        group = groups[meta["group"]]
        if value_type(item.name) is bool:
            group.add_argument(flag_name(item.name), dest=item.name, action="store_true",
                               help=meta["help"])
            continue
        default = meta["env"].get() if meta["env"] is not None else item.default
        group.add_argument(flag_name(item.name), dest=item.name, type=value_type(item.name),
                           default=default, metavar=meta["metavar"], help=meta["help"])
    return groups


def from_args(args: argparse.Namespace, **rest: Any) -> ServerSettings:
    """The settings of parsed flags; `rest` sets the options that are no flags."""
    return ServerSettings(**{item.name: getattr(args, item.name) for item in flag_fields()},
                          **rest)
