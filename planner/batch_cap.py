"""`max_num_seqs` from `pagode plan --calibrate`'s measured decode throughput.

`pagode plan --calibrate` times decode-only steps at batches of 1 to 192 (the grid's
`decode_tok_s`, kept in the fit file); the cap is the knee of those rates at the longest
context measured (engine/core/batch_cap.py holds the rule). The rates are read as
measured, not from the fitted line: the fit is linear in the batch, while a GEMM can run
many more tokens per second at 256 rows than at 16, so the line puts the knee far too
early (docs/speed.md). Without a fit the engine times its own decode steps at load
(engine/runner/decode_rates.py) and applies the same rule. A user's --max-num-seqs wins.
"""

from __future__ import annotations

from pathlib import Path

from engine.config import EngineConfig
from engine.core.batch_cap import MIN_GAIN, BatchCap, knee
from planner.calibrate import default_fit_path
from planner.memory import device_dtypes
from planner.step_model import StepTimeModel


def fit_path_for(config: EngineConfig) -> Path:
    from engine.model.loader import resolve_model

    kv_dtype, w_dtype = device_dtypes(config)
    return default_fit_path(resolve_model(config.model).name, config.torch_device.type, w_dtype, kv_dtype)


def choose(config: EngineConfig) -> BatchCap | None:
    """max_num_seqs for `config` from its cached calibration; None where there is none."""
    path = fit_path_for(config)
    if not path.exists():
        return None
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
        return BatchCap(default, f"the default: at context {context}, a bigger batch measured still gained "
                                 f">= {MIN_GAIN:.0%} decode tok/s per doubling ({shown}; {path})")
    return BatchCap(cap, f"measured at context {context}, no bigger batch gains >= {MIN_GAIN:.0%} "
                         f"decode tok/s per doubling ({shown}; {path})")
