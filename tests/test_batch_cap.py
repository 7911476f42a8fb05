"""The default max_num_seqs from measured decode throughput: `pagode plan --calibrate`'s fit
(planner/calibrate.py), or the decode steps the engine times at load (engine/tuning/batch_cap.py,
engine/tuning/decode_rates.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from engine import envs
from engine.llm import LLM
from engine.tuning import batch_cap, race_memory
from engine.tuning.batch_cap import from_step_seconds
from engine.tuning.decode_rates import BATCHES
from engine.tuning.timing import plausible
from planner.calibrate import decode_rates, fit_path_for
from planner.step_model import FEATURES, StepTimeModel, StepWork
from server.cli import build_parser, engine_config, size_batch


def test_the_cap_is_the_first_batch_no_bigger_one_beats_by_ten_percent_per_doubling() -> None:
    rates = {1: 150.0, 4: 300.0, 12: 450.0, 24: 600.0, 48: 640.0, 96: 700.0}
    assert batch_cap.knee(rates, ceiling=256) == 24  # 48 adds under 10%
    assert batch_cap.knee(rates, ceiling=256, min_gain=0.05) is None  # each doubling gains >= 5%
    assert batch_cap.knee({1: 100.0, 8: 400.0, 64: 900.0}, ceiling=256) is None  # still paying
    assert batch_cap.knee(rates, ceiling=12) is None  # only batches the engine may run count
    # A plateau (the fused step handing over to the GEMMs) is stepped over: 16 gains little
    # over 8, but 32 gains 49% over 16; 192 gains under 10% per doubling over 128.
    plateau = {1: 125.0, 8: 242.0, 16: 258.0, 32: 385.0, 64: 438.0, 128: 610.0, 192: 640.0, 256: 650.0}
    assert batch_cap.knee(plateau, ceiling=256) == 128


def test_decode_rates_come_from_the_decode_only_steps() -> None:
    works = [StepWork(decode_seqs=4, decode_context=4 * 30), StepWork(decode_seqs=4, decode_context=4 * 34),
             StepWork(decode_seqs=4, decode_context=4 * 190, prefill_tokens=64),  # mixed: left out
             StepWork(decode_seqs=8, decode_context=8 * 200), StepWork(decode_seqs=8, decode_context=8 * 180)]
    rates = decode_rates(works, [0.010, 0.030, 0.5, 0.040, 0.040], (32, 192))
    assert rates == {"32": {"4": 200.0}, "192": {"8": 200.0}}  # 4 / median(10, 30 ms); 8 / 40 ms


@pytest.fixture()
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty pagode cache, but for the compiled kernels (resolving `auto` loads them)."""
    kernels = envs.CACHE_DIR.get() / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    (tmp_path / "kernels").symlink_to(kernels)
    monkeypatch.setenv("PAGODE_CACHE_DIR", str(tmp_path))
    return tmp_path


def save_calibration(decode_tok_s: dict[str, dict[str, float]]) -> Path:
    path = fit_path_for(engine_config(build_parser().parse_args(["serve"])))
    model = StepTimeModel([0.01] * len(FEATURES), "cpu")
    model.meta["decode_tok_s"] = decode_tok_s
    model.save(path)
    return path


def serve_log(argv: list[str], caplog: pytest.LogCaptureFixture) -> tuple[int, str]:
    args = build_parser().parse_args(["serve", *argv])
    config = engine_config(args)
    with caplog.at_level(logging.INFO, logger="pagode.server"):
        size_batch(config, args)
    return config.max_num_seqs, caplog.text


def test_serve_caps_the_batch_where_the_longest_context_stops_paying(cache_dir: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    path = save_calibration({"32": {"24": 900.0, "48": 1500.0, "96": 2500.0},
                             "192": {"24": 600.0, "48": 640.0, "96": 700.0}})
    cap, text = serve_log([], caplog)
    assert cap == 24 and "max_num_seqs 24: measured at context 192" in text and str(path) in text
    assert "no bigger batch gains >= 10% decode tok/s per doubling" in text


def test_serve_keeps_the_default_while_bigger_batches_still_pay(cache_dir: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    save_calibration({"192": {"24": 400.0, "48": 600.0, "96": 800.0}})
    cap, text = serve_log([], caplog)
    assert cap == 256 and "still gained" in text


def test_the_users_flag_wins_over_the_calibration(cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    save_calibration({"192": {"24": 600.0, "48": 610.0}})
    cap, text = serve_log(["--max-num-seqs", "300"], caplog)
    assert cap == 300 and "max_num_seqs 300: set by --max-num-seqs" in text


def test_without_a_calibration_the_engine_sizes_the_batch_at_load(
        cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    args = build_parser().parse_args(["serve"])
    config = engine_config(args)
    with caplog.at_level(logging.INFO, logger="pagode.server"):
        size_batch(config, args)
    assert config.size_batch and config.max_num_seqs == 256 and "sized at load" in caplog.text


def test_an_itl_target_asks_the_engine_even_with_a_calibration(cache_dir: Path) -> None:
    save_calibration({"192": {"24": 600.0, "48": 610.0}})
    args = build_parser().parse_args(["serve", "--max-itl-ms", "50"])
    config = engine_config(args)
    size_batch(config, args)
    assert config.size_batch and config.max_itl_ms == 50


def test_step_times_cap_at_the_knee_and_at_the_itl_target() -> None:
    # 8 -> 16 doubles the rate, 16 -> 32 gains 60%, 32 -> 64 gains 5%: the knee is 32.
    seconds = {1: 0.010, 8: 0.020, 16: 0.020, 32: 0.025, 64: 0.0476}
    cap = from_step_seconds(seconds, ceiling=256, context=192)
    assert cap.max_num_seqs == 32 and "no bigger batch gains >= 10%" in cap.reason
    assert from_step_seconds(seconds, ceiling=16, context=192).max_num_seqs == 16  # never past the ceiling
    assert from_step_seconds(seconds, ceiling=256, context=192, max_itl_ms=22).max_num_seqs == 16
    assert from_step_seconds(seconds, ceiling=256, context=192, max_itl_ms=1000).max_num_seqs == 32
    tight = from_step_seconds(seconds, ceiling=256, context=192, max_itl_ms=5)
    assert tight.max_num_seqs == 1 and "even 1 decodes took 10 ms" in tight.reason
    paying = {8: 0.010, 16: 0.012, 32: 0.015}
    assert from_step_seconds(paying, ceiling=256, context=192).max_num_seqs == 256
    busy = {1: 0.010, 8: 0.090, 16: 0.180, 32: 0.330}  # batching never paid: contention
    floored = from_step_seconds(busy, ceiling=256, context=192)
    assert floored.max_num_seqs == 16 and "stays >= 16" in floored.reason
    assert not plausible(busy) and plausible(seconds)


def kept_step_times() -> dict[str, dict[str, float]]:
    return race_memory._read(race_memory.path_for(race_memory.machine()))["races"]["decode-step-seconds"]


def test_the_engine_times_its_steps_once_per_machine(cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With size_batch the engine caps its batch from decode steps it timed and keeps the
    times; a later load reads them back (an ITL target below every measured step then leaves
    the smallest batch) instead of timing again."""
    args: dict[str, object] = dict(kv_cache_memory="64MiB", max_model_len=256, quantization="int4",
                                   size_batch=True)
    with caplog.at_level(logging.INFO, logger="pagode"):
        first = LLM(**args)  # type: ignore[arg-type]
    kept = kept_step_times()
    assert len(kept) == 1, kept
    seconds = {int(b): t for b, t in next(iter(kept.values())).items()}
    # Only the batches whose sequences all fit this small cache at 192 positions were timed.
    fit = first.engine.num_blocks // -(-192 // first.engine.block_size)
    assert set(seconds) == {b for b in BATCHES if b <= fit} and max(seconds) < 256
    expected = from_step_seconds(seconds, 256, 192)
    assert first.engine.config.max_num_seqs == expected.max_num_seqs
    assert f"max_num_seqs {expected.max_num_seqs}: {expected.reason}" in caplog.text
    del first
    tight = LLM(**args, max_itl_ms=min(seconds.values()) * 1e3 / 2)  # type: ignore[arg-type]
    assert tight.engine.config.max_num_seqs == min(seconds)
    assert kept_step_times() == kept
