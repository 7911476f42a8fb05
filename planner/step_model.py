"""The step-time model: seconds per engine step from what the step computes.

    t = c0 + c1 * decode_seqs + c2 * decode_context / 1e3
          + c3 * prefill_tokens + c4 * prefill_attention / 1e6

decode_context is the sum of the decode sequences' context lengths (attention reads
that many K/V positions); prefill_attention is the sum over prefill chunks of
chunk x (cached + chunk) positions (attention's quadratic part).

A decode-only step of at most `fused_decode_limit` sequences runs the fused C++ decode
step (engine/model/decode_step.py), a different code path with its own fixed cost and
cost per sequence: a much smaller fixed cost and a larger one per sequence than layer by
layer (docs/speed.md). Such a step puts its 1 and its batch size in the two `fused_*` columns
instead of `const` and `decode_seqs`, so the model is piecewise linear in the batch and
both pieces keep non-negative coefficients. The limit comes from the calibrated engine
(0: no fused step, as on CUDA, and the two columns stay empty).

The coefficients come from a least-squares fit on steps timed by the real engine
(calibrate.py); a coefficient that comes out negative is dropped and the rest refitted,
so a prediction never falls as work grows within a piece.

What the engine alone does not pay, the server and its clients do: every token is an SSE
event the server writes and the client parses, on the same cores when they share a machine
(docs/speed.md). `overhead_s` + `overhead_per_seq_s` x sequences adds that cost to every
step; both are 0 for the engine alone, and `pagode plan --serving-overhead` sets them from a
measurement (benchmarks/plan_check.py measures them against the live server with short
probes; overhead.py fits them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

INTERCEPTS = ("const", "fused_const")  # kept even if negative: each piece needs its own
FEATURES = ("const", "decode_seqs", "decode_context_k", "prefill_tokens", "prefill_attention_m",
            "fused_const", "fused_decode_seqs")


@dataclass(frozen=True)
class StepWork:
    """What one step computes: decodes and prefill chunks."""

    decode_seqs: int = 0
    decode_context: int = 0  # sum of the decodes' context lengths, in tokens
    prefill_tokens: int = 0
    prefill_attention: int = 0  # sum of chunk * (cached + chunk)

    def vector(self, fused_decode_limit: int = 0) -> list[float]:
        """The features; a decode-only step within the fused limit fills the fused columns."""
        fused = self.prefill_tokens == 0 and 0 < self.decode_seqs <= fused_decode_limit
        base = [0.0, 0.0] if fused else [1.0, float(self.decode_seqs)]
        return [*base, self.decode_context / 1e3, float(self.prefill_tokens), self.prefill_attention / 1e6,
                *([1.0, float(self.decode_seqs)] if fused else [0.0, 0.0])]


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
    fused_decode_limit: int = 0  # decode-only steps up to this batch take the fused path
    meta: dict[str, Any] = field(default_factory=dict)
    overhead_s: float = 0.0  # serving cost per step, beyond the engine's
    overhead_per_seq_s: float = 0.0  # ... and per sequence in the step

    def __post_init__(self) -> None:
        if len(self.coefficients) != len(FEATURES):
            raise ValueError(f"{len(FEATURES)} coefficients expected ({', '.join(FEATURES)}), "
                             f"got {len(self.coefficients)}")

    def predict(self, work: StepWork) -> float:
        engine = float(np.dot(self.coefficients, work.vector(self.fused_decode_limit)))
        seqs = work.decode_seqs + (1 if work.prefill_tokens else 0)
        return max(engine + self.overhead_s + self.overhead_per_seq_s * seqs, 1e-6)

    def to_json(self) -> dict[str, Any]:
        return {"features": list(FEATURES), **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepTimeModel:
        if data.get("features") != list(FEATURES):
            raise ValueError("the fit file was made for other features; run pagode plan --calibrate")
        return cls([float(c) for c in data["coefficients"]], data.get("device", "unknown"),
                   int(data.get("fused_decode_limit", 0)), data.get("meta", {}))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> StepTimeModel:
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")))


def fit(works: Sequence[StepWork], times: Sequence[float], device: str = "unknown",
        fused_decode_limit: int = 0) -> StepTimeModel:
    """Least squares with non-negative coefficients (drop the negative ones, refit)."""
    if len(works) != len(times) or len(works) < len(FEATURES):
        raise ValueError(f"need at least {len(FEATURES)} timed steps to fit, got {len(works)}")
    x = np.array([w.vector(fused_decode_limit) for w in works])
    y = np.asarray(times, dtype=float)
    active = [i for i in range(len(FEATURES)) if np.any(x[:, i] != 0)]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        negative = [a for a, c in zip(active, coef, strict=True) if c < 0 and FEATURES[a] not in INTERCEPTS]
        if not negative:
            break
        active.remove(min(negative, key=lambda a: coef[active.index(a)]))
    full = [0.0] * len(FEATURES)
    for a, c in zip(active, coef, strict=True):
        full[a] = float(c)
    model = StepTimeModel(full, device, fused_decode_limit)
    pred = x @ np.array(full)
    rel = np.abs(pred - y) / np.maximum(y, 1e-9)
    model.meta = {"steps": len(works), "median_rel_error": float(np.median(rel)),
                  "p90_rel_error": float(np.percentile(rel, 90))}
    return model
