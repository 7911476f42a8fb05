"""The default `max_num_seqs` from this machine's measured decode throughput.

A bigger decode batch pays while a step's fixed cost (weights read once, Python, thread
start-up) dominates, and stops paying once the per-sequence cost (attention over each
context, the sequence's share of the GEMMs) does: each step grows longer and every running
request waits through it. Left uncapped, paged batching grows its batch past that point and
can serve less than fixed batches.

`pagode plan --calibrate` times decode-only steps at batches of 1 to 192 (the grid's
`decode_tok_s`, kept in the fit file). The cap is the first measured batch after which the
next one (about twice as big) gains less than MIN_GAIN in tokens/s, read at the longest
context measured; where throughput still rises at the biggest batch, the engine's default
stays. The rates are read as measured, not from the fitted line: the fit is linear in the
batch, while a GEMM can run many more tokens per second at 256 rows than at 16, so the
line puts the knee far too early (docs/speed.md). Without a fit, or with one from
before the rates were kept, the default stays and the start-up line says how to get one.
A user's --max-num-seqs wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineConfig
from planner.calibrate import default_fit_path
from planner.memory import device_dtypes
from planner.step_model import StepTimeModel

MIN_GAIN = 0.10


@dataclass(frozen=True)
class BatchCap:
    max_num_seqs: int
    reason: str


def knee(rates: dict[int, float], ceiling: int, min_gain: float = MIN_GAIN) -> int | None:
    """The first batch whose successor gains less than `min_gain`; None where each one pays."""
    batches = sorted(b for b in rates if b <= ceiling)
    for small, big in zip(batches, batches[1:], strict=False):
        if rates[big] < (1 + min_gain) * rates[small]:
            return small
    return None


def fit_path_for(config: EngineConfig) -> Path:
    from engine.model.loader import resolve_model

    kv_dtype, w_dtype = device_dtypes(config)
    return default_fit_path(resolve_model(config.model).name, config.torch_device.type, w_dtype, kv_dtype)


def choose(config: EngineConfig) -> BatchCap:
    """max_num_seqs for `config` from its cached calibration; the engine's default where there is none."""
    path = fit_path_for(config)
    if not path.exists():
        return BatchCap(config.max_num_seqs, f"the default: no calibration at {path} (`pagode plan --calibrate` "
                                              "measures this machine, and later starts size the batch from it)")
    return from_calibration(StepTimeModel.load(path), path, config.max_num_seqs)


def from_calibration(model: StepTimeModel, path: Path, default: int) -> BatchCap:
    """The cap that the decode rates measured in `model` (read from `path`) give, at most `default`."""
    measured = model.meta.get("decode_tok_s") or {}
    if not measured:
        return BatchCap(default, f"the default: the calibration at {path} has no decode rates "
                                 "(rerun `pagode plan --calibrate`)")
    context = max(measured, key=int)
    rates = {int(b): float(r) for b, r in measured[context].items()}
    shown = ", ".join(f"{b}: {r:.0f}" for b, r in sorted(rates.items()))
    cap = knee(rates, default)
    if cap is None:
        return BatchCap(default, f"the default: at context {context}, each bigger batch measured still gained "
                                 f">= {MIN_GAIN:.0%} decode tok/s ({shown}; {path})")
    return BatchCap(cap, f"measured at context {context}, the next batch gains < {MIN_GAIN:.0%} "
                         f"decode tok/s ({shown}; {path})")
