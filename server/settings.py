"""Server-side options (the engine's own knobs live in engine.config.EngineConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServerSettings:
    served_model_name: str | None = None  # None: the engine's model name
    api_key: str | None = None  # None: no authentication
    max_num_queued_reqs: int | None = None  # None: unbounded queue
    shutdown_timeout: float = 30.0  # seconds to drain in-flight requests on SIGTERM
    log_requests_text: bool = False  # log prompt and output text in the request log
    debug_endpoints: bool = False  # POST /debug/kill-engine-loop (tests only)
    retry_after_s: int = 1  # Retry-After on 429 and 503
    url: str | None = None  # where it listens, for the startup log line
    cors: dict[str, object] = field(default_factory=dict)  # CORSMiddleware's arguments; {}: off

    def __post_init__(self) -> None:
        if self.max_num_queued_reqs is not None and self.max_num_queued_reqs < 0:
            raise ValueError("max_num_queued_reqs must be non-negative")
        if self.shutdown_timeout < 0:
            raise ValueError("shutdown_timeout must be non-negative")
