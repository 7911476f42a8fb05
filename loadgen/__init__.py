"""pagode-loadgen: replay a seeded arrival trace against any OpenAI-compatible server.

This package is a pure client: it talks HTTP only and never imports the engine, the
server or torch, so it runs from any machine against pagode, vLLM or llama-server.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
