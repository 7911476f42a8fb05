"""Attention over the paged KV cache, behind one interface with swappable backends."""

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.attention.selection import BACKENDS, select_backend

__all__ = ["BACKENDS", "AttentionBackend", "AttentionMetadata", "select_backend"]
