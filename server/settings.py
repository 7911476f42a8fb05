"""Server-side options (the engine's own knobs, per-request caps included, live in
engine.config.EngineConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServerSettings:
    served_model_name: str | None = None  # None: the engine's model name
    api_key: str | None = None  # None: no authentication
    # None: derived from the KV capacity once the engine is loaded (admission.default_queue_bound)
    max_num_queued_reqs: int | None = None
    shutdown_timeout: float = 30.0  # seconds to drain in-flight requests on SIGTERM
    log_requests_text: bool = False  # log prompt and output text in the request log
    retry_after_s: int = 1  # Retry-After on 429 and 503
    url: str | None = None  # where it listens, for the startup log line
    # Slow and hostile clients (server/middleware/http_limits.py, server/api/body.py)
    max_body_bytes: int = 4 * 2**20  # larger bodies get 413
    max_header_bytes: int = 16 * 2**10  # larger header blocks get 431
    header_timeout_s: float = 10.0  # a connection must send a whole request head within this
    body_timeout_s: float = 30.0  # and then its whole body within this (408)
    sse_send_timeout_s: float = 30.0  # a stream whose client stops reading is cut and aborted
    limit_concurrency: int = 1024  # open connections + tasks; past it uvicorn answers 503
    timeout_keep_alive_s: float = 5.0  # idle keep-alive connections are closed after this
    profile_steps: int = 0  # log where the time of every N engine steps goes (0: off)
    cors: dict[str, object] = field(default_factory=dict)  # CORSMiddleware's arguments; {}: off

    def __post_init__(self) -> None:
        if self.max_num_queued_reqs is not None and self.max_num_queued_reqs < 0:
            raise ValueError("max_num_queued_reqs must be non-negative")
        if self.shutdown_timeout < 0:
            raise ValueError("shutdown_timeout must be non-negative")
        for name in ("max_body_bytes", "max_header_bytes", "header_timeout_s", "body_timeout_s",
                     "sse_send_timeout_s", "limit_concurrency", "timeout_keep_alive_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
