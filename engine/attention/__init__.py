"""Attention over the paged KV cache, behind one interface with swappable backends."""

from engine.attention.backend import AttentionBackend, select_backend
from engine.attention.metadata import AttentionMetadata

__all__ = ["AttentionBackend", "AttentionMetadata", "select_backend"]
