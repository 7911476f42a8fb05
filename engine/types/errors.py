"""Errors the engine raises to its callers."""


class EngineError(Exception):
    """Base class."""


class InvalidRequestError(EngineError, ValueError):
    """The request can never be served as given (HTTP 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineDeadError(EngineError):
    """The engine loop has stopped; no request can be served (HTTP 503)."""


class RequestFailedError(EngineError):
    """An exception inside the engine failed this request alone (HTTP 500)."""
