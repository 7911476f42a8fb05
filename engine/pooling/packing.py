"""Right-padded rows as one packed stream of their real tokens.

An encoder's linear layers, norms and activations treat every token alike, so they run on
the [T, H] stream of the batch's real tokens only: a padded [B, L] batch would spend as much
on its padding as on the shortest rows' text. Attention alone needs the rows apart; it
scatters the stream into a zero-padded [B, heads, L, d] grid, masks the padded keys, and
gathers the real tokens back.
"""

from __future__ import annotations

import torch


class Packing:
    """Where each row's tokens lie in the packed stream and in the padded grid."""

    def __init__(self, lengths: torch.Tensor, width: int) -> None:
        self.rows = int(lengths.shape[0])
        self.width = width
        self.valid = torch.arange(width)[None, :] < lengths[:, None]  # [B, L]
        self.flat = self.valid.flatten().nonzero().squeeze(1)  # [T] indices into the B*L grid
        self.keep = self.valid[:, None, None, :]  # [B, 1, 1, L]: the keys attention may read

    def pack(self, grid: torch.Tensor) -> torch.Tensor:
        """[B, L, ...] -> [T, ...]: the real tokens, row after row."""
        return grid.reshape(self.rows * self.width, *grid.shape[2:])[self.flat]

    def pad(self, stream: torch.Tensor) -> torch.Tensor:
        """[T, ...] -> [B, L, ...], zeros where a row has no token."""
        grid = stream.new_zeros(self.rows * self.width, *stream.shape[1:])
        grid[self.flat] = stream
        return grid.view(self.rows, self.width, *stream.shape[1:])

    def heads(self, stream: torch.Tensor, num_heads: int) -> torch.Tensor:
        """[T, heads * d] -> [B, heads, L, d], as attention reads it."""
        return self.pad(stream).unflatten(-1, (num_heads, -1)).transpose(1, 2)

    def tokens(self, grid: torch.Tensor) -> torch.Tensor:
        """Attention's [B, heads, L, d] -> the stream's [T, heads * d]."""
        return self.pack(grid.transpose(1, 2).flatten(2))
