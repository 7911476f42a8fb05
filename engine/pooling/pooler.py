"""From a batch's token states to one vector per input: CLS, mean or last-token pooling,
L2 normalization, and Matryoshka truncation."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pool(hidden: torch.Tensor, lengths: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden [B, L, H] of right-padded rows, lengths [B] -> [B, H]. Mean averages only the
    row's own tokens, as sentence-transformers weighs by the attention mask."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "last":
        return hidden[torch.arange(hidden.shape[0]), lengths - 1]
    if mode == "mean":
        mask = (torch.arange(hidden.shape[1])[None, :] < lengths[:, None]).to(hidden.dtype)
        return (hidden * mask[..., None]).sum(dim=1) / lengths[:, None].to(hidden.dtype)
    raise ValueError(f"unknown pooling {mode!r}; expected cls, mean or last")


def normalize(vectors: torch.Tensor) -> torch.Tensor:
    return F.normalize(vectors, p=2.0, dim=-1)


def shorten(vector: torch.Tensor, dimensions: int | None) -> torch.Tensor:
    """Matryoshka: keep the first `dimensions` values, then renormalize, so the shorter vector
    is again a unit vector that cosine and dot product rank alike."""
    if dimensions is None or dimensions >= vector.shape[-1]:
        return vector
    return normalize(vector[..., :dimensions])
