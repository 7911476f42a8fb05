"""The step-time model: seconds per engine step from what the step computes.

    t = c0 + c1 * decode_seqs + c2 * decode_context / 1e3
          + c3 * prefill_tokens + c4 * prefill_attention / 1e6

decode_context is the sum of the decode sequences' context lengths (attention reads
that many K/V positions); prefill_attention is the sum over prefill chunks of
chunk x (cached + chunk) positions (attention's quadratic part). The coefficients
come from a least-squares fit on steps timed by the real engine (calibrate.py);
a coefficient that comes out negative is dropped and the rest refitted, so a
prediction never falls as work grows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FEATURES = ("const", "decode_seqs", "decode_context_k", "prefill_tokens", "prefill_attention_m")


@dataclass(frozen=True)
class StepWork:
    """What one step computes: decodes and prefill chunks."""

    decode_seqs: int = 0
    decode_context: int = 0  # sum of the decodes' context lengths, in tokens
    prefill_tokens: int = 0
    prefill_attention: int = 0  # sum of chunk * (cached + chunk)

    def vector(self) -> list[float]:
        return [1.0, float(self.decode_seqs), self.decode_context / 1e3,
                float(self.prefill_tokens), self.prefill_attention / 1e6]


def work_of(chunks: Iterable[tuple[int, int]]) -> StepWork:
    """StepWork from (new tokens, tokens already computed) of each scheduled sequence.

    A sequence computing one token past a computed context is a decode (or the last
    token of a prompt whose prefix was cached, which costs the same)."""
    d_seqs = d_ctx = p_tok = p_attn = 0
    for new, done in chunks:
        if new == 1:
            d_seqs += 1
            d_ctx += done + 1
        else:
            p_tok += new
            p_attn += new * (done + new)
    return StepWork(d_seqs, d_ctx, p_tok, p_attn)


@dataclass
class StepTimeModel:
    coefficients: list[float]  # seconds, per FEATURES
    device: str = "unknown"
    meta: dict[str, Any] = field(default_factory=dict)

    def predict(self, work: StepWork) -> float:
        return max(float(np.dot(self.coefficients, work.vector())), 1e-6)

    def to_json(self) -> dict[str, Any]:
        return {"features": list(FEATURES), **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepTimeModel:
        if data.get("features") != list(FEATURES):
            raise ValueError("the fit file was made for other features; run pagode plan --calibrate")
        return cls([float(c) for c in data["coefficients"]], data.get("device", "unknown"),
                   data.get("meta", {}))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> StepTimeModel:
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")))


def fit(works: Sequence[StepWork], times: Sequence[float], device: str = "unknown") -> StepTimeModel:
    """Least squares with non-negative coefficients (drop the negative ones, refit)."""
    if len(works) != len(times) or len(works) < len(FEATURES):
        raise ValueError(f"need at least {len(FEATURES)} timed steps to fit, got {len(works)}")
    x = np.array([w.vector() for w in works])
    y = np.asarray(times, dtype=float)
    active = [i for i in range(len(FEATURES)) if np.any(x[:, i] != 0)]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        negative = [a for a, c in zip(active, coef, strict=True) if c < 0 and a != 0]
        if not negative:
            break
        active.remove(min(negative, key=lambda a: coef[active.index(a)]))
    full = [0.0] * len(FEATURES)
    for a, c in zip(active, coef, strict=True):
        full[a] = float(c)
    model = StepTimeModel(full, device)
    pred = x @ np.array(full)
    rel = np.abs(pred - y) / np.maximum(y, 1e-9)
    model.meta = {"steps": len(works), "median_rel_error": float(np.median(rel)),
                  "p90_rel_error": float(np.percentile(rel, 90))}
    return model
