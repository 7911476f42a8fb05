"""Many short inputs packed into few forwards: sorted by length so that a padded batch wastes
little, and cut where the next row would take the batch past the token budget."""

from __future__ import annotations


def plan_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices into `lengths`, grouped so that each group's rows x longest row stays within
    `budget` (a row longer than the budget runs alone)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        # Sorted ascending, so this row is the longest of the batch it joins.
        if current and (len(current) + 1) * lengths[index] > budget:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches
