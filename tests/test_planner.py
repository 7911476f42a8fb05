"""`pagode plan`: the memory formula, the step-time fit, the simulator and the CLI.

The formulas are checked against values computed by hand from the default model's real
config; the simulator against closed forms under a constant step time, with the block
manager's invariants checked after every simulated step; calibration runs the real
engine on a tiny grid.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import pytest

from engine.model.config import ModelConfig
from engine.model.loader import read_config, resolve_model
from engine.runner.kv_cache import num_blocks_for
from planner.memory import count_parameters, kv_bytes_per_token, plan_memory, weight_bytes
from planner.predict import SLO, attainment, bisect_rate, parse_slo, summarize
from planner.simulator import SimConfig, Simulator
from planner.step_model import FEATURES, StepTimeModel, StepWork, fit, work_of
from planner.workload import PlannedRequest, Workload

GIB = 2**30


@pytest.fixture(scope="module")
def smol() -> ModelConfig:
    return read_config(resolve_model(None))


def test_kv_bytes_per_token_of_the_default_model(smol: ModelConfig) -> None:
    # 2 (K, V) x 30 layers x 3 KV heads x 64 head_dim x 4 bytes (fp32)
    assert kv_bytes_per_token(smol, "fp32") == 2 * 30 * 3 * 64 * 4 == 46_080
    assert kv_bytes_per_token(smol, "fp16") == 23_040
    mem = plan_memory(smol, GIB, "fp32")
    assert mem.num_blocks == GIB // (46_080 * 16) == 1456
    assert mem.kv_tokens == 23_296
    assert mem.max_sequences(512) == 1456 // 32 == 45
    assert mem.max_sequences(500) == 45  # 500 positions still hold 32 whole blocks
    # the engine sizes its cache the same way
    import torch
    assert mem.num_blocks == num_blocks_for(GIB, smol, 16, torch.float32)
    assert plan_memory(smol, GIB, "fp16").num_blocks == 2912
    # int8: 64 one-byte values and a 4-byte scale per row, 1.88x fp16's tokens
    assert kv_bytes_per_token(smol, "int8") == 2 * 30 * 3 * (64 + 4) == 12_240
    assert plan_memory(smol, GIB, "int8").num_blocks == GIB // (12_240 * 16) == 5482
    assert plan_memory(smol, GIB, "int8").num_blocks == num_blocks_for(GIB, smol, 16, torch.int8)


def test_weights_of_the_default_model(smol: ModelConfig) -> None:
    per_layer = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536 + 2 * 576  # q,o + k,v + mlp + norms
    expected = 30 * per_layer + 49_152 * 576 + 576  # tied embeddings, final norm
    assert count_parameters(smol) == expected == 134_515_008
    assert weight_bytes(smol, "fp32") == 4 * expected
    assert weight_bytes(smol, "int8") == expected
    assert weight_bytes(smol, "int4") == expected // 2


def test_the_seed_articles_8b_example() -> None:
    cfg = ModelConfig("llama", 128_256, 4096, 14_336, 32, 32, 8, 128)
    assert kv_bytes_per_token(cfg, "fp16") == 131_072  # "≈ 131 KB par jeton"
    assert 2048 * kv_bytes_per_token(cfg, "fp16") == 256 * 2**20  # "2k jetons ≈ 256 MiB"
    with pytest.raises(ValueError):
        kv_bytes_per_token(cfg, "fp7")


def test_fit_recovers_known_coefficients() -> None:
    true = [0.02, 0.001, 0.003, 0.0005, 0.04, 0.008, 0.003]
    works = [StepWork(b, b * c, p, p * (p + c)) for b in (1, 4, 16, 64) for c in (32, 300)
             for p in (0, 64, 500)]
    times = [StepTimeModel(true, fused_decode_limit=16).predict(w) for w in works]
    model = fit(works, times, fused_decode_limit=16)
    assert model.coefficients == pytest.approx(true, rel=1e-6)
    assert model.meta["median_rel_error"] < 1e-9
    # a feature that only adds noise in the wrong direction is dropped, not made negative
    model = fit(works, [t - 1e-5 * w.decode_context / 1e3 for t, w in zip(times, works, strict=True)],
                fused_decode_limit=16)
    assert all(c >= 0 for c in model.coefficients[1:])


def test_fused_decode_steps_take_their_own_piece() -> None:
    model = StepTimeModel([0.05, 0.001, 0.0, 0.0, 0.0, 0.01, 0.003], fused_decode_limit=16)
    assert model.predict(StepWork(1, 100)) == pytest.approx(0.01 + 0.003)
    assert model.predict(StepWork(16, 1600)) == pytest.approx(0.01 + 16 * 0.003)
    assert model.predict(StepWork(17, 1700)) == pytest.approx(0.05 + 17 * 0.001)
    # a step with a prefill chunk is never fused, whatever its decode batch
    assert model.predict(StepWork(1, 100, 64, 64 * 64)) == pytest.approx(0.05 + 0.001)
    # no fused step (CUDA, or PAGODE_DECODE_STEP=0): one piece, the fused columns stay empty
    works = [StepWork(b, b * 64) for b in (1, 2, 8, 32)] + [StepWork(b, b * 64, 64, 4096) for b in (1, 8, 32)]
    flat = fit(works, [0.02 + 0.001 * w.decode_seqs + 1e-5 * w.prefill_tokens for w in works])
    assert flat.coefficients[5:] == [0.0, 0.0] and flat.fused_decode_limit == 0
    assert StepTimeModel.from_json(flat.to_json()).fused_decode_limit == 0


def test_work_of_splits_decodes_and_prefill_chunks() -> None:
    work = work_of([(1, 99), (1, 9), (64, 0), (32, 64)])
    assert work == StepWork(decode_seqs=2, decode_context=110, prefill_tokens=96,
                            prefill_attention=64 * 64 + 32 * 96)


CONSTANT = 0.05


def constant_model() -> StepTimeModel:
    return StepTimeModel([CONSTANT, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])


def test_one_request_alone_takes_one_step_per_token() -> None:
    sim = Simulator(SimConfig(num_blocks=64), constant_model(), check_invariants=True)
    res = sim.run([PlannedRequest(0.0, 100, 20)])
    (r,) = res.requests
    assert r.ttft == pytest.approx(CONSTANT)  # 100 prompt tokens fit in one 512-token step
    assert r.e2e == pytest.approx(20 * CONSTANT)
    assert r.itls == pytest.approx([CONSTANT] * 19)
    assert sim.block_manager.num_used == 0


def test_a_full_batch_at_once_matches_the_closed_form() -> None:
    # 8 prompts of 64 tokens = one 512-token prefill step, then 31 decode steps for all
    n, out = 8, 32
    sim = Simulator(SimConfig(num_blocks=256), constant_model(), check_invariants=True)
    res = sim.run([PlannedRequest(0.0, 64, out) for _ in range(n)])
    s = summarize(res)
    assert res.steps == out
    assert s["output_throughput"] == pytest.approx(n * out / (out * CONSTANT))
    assert s["e2e_s"]["p50"] == pytest.approx(out * CONSTANT)
    assert s["ttft_s"]["p99"] == pytest.approx(CONSTANT)
    assert sim.block_manager.num_used == 0


def test_chunked_prefill_delays_the_first_token() -> None:
    # 1000 prompt tokens with a 512-token budget: two prefill steps before the first token
    sim = Simulator(SimConfig(num_blocks=256), constant_model())
    (r,) = sim.run([PlannedRequest(0.0, 1000, 4)]).requests
    assert r.ttft == pytest.approx(2 * CONSTANT)


def test_spaced_arrivals_never_queue() -> None:
    specs = [PlannedRequest(10.0 * i, 50, 10) for i in range(5)]
    res = Simulator(SimConfig(num_blocks=64), constant_model()).run(specs)
    assert [r.ttft for r in res.requests] == pytest.approx([CONSTANT] * 5)
    assert res.duration == pytest.approx(40 + 10 * CONSTANT)


def test_preemption_under_a_small_cache_completes_everything_without_leaks() -> None:
    work = Workload((16, 128), (32, 200), num_requests=40, seed=3)
    model = StepTimeModel([0.01, 0.001, 0.0, 0.0001, 0.0, 0.0, 0.0])
    sim = Simulator(SimConfig(num_blocks=60, max_model_len=400), model, check_invariants=True)
    res = sim.run(work.requests(math.inf))
    assert len(res.requests) == 40 and res.unservable == 0
    assert res.preemptions > 0
    assert all(len(r.token_times) == r.spec.output_len for r in res.requests)
    assert sim.block_manager.num_used == 0
    sim.block_manager.check_invariants([])


def test_unservable_requests_are_those_the_engine_refuses() -> None:
    """The engine's own rule (request_limits.check_context on the scheduler's limits): 64
    blocks of 16 less a 6-block watermark admit prompts of at most 58 x 16 - 1 tokens."""
    sim = Simulator(SimConfig(num_blocks=64, max_model_len=2048), constant_model())
    assert sim.scheduler.max_prompt_tokens == 58 * 16 - 1
    specs = [PlannedRequest(0.0, 58 * 16 - 1, 1), PlannedRequest(0.0, 58 * 16, 1),
             PlannedRequest(0.0, 1000, 1100)]  # fits, too long for the cache, over max_model_len
    res = Simulator(SimConfig(num_blocks=64, max_model_len=2048), constant_model()).run(specs)
    assert len(res.requests) == 1 and res.unservable == 2


def test_plan_takes_serves_engine_flags() -> None:
    """`pagode plan` is asked with the very flags of the server it plans for, same defaults."""
    from engine.arg_utils import engine_config
    from server.cli import build_parser

    parser = build_parser()
    for flags in ([], ["--policy", "static", "--kv-cache-dtype", "fp32", "--watermark", "0.2"]):
        serve, plan = parser.parse_args(["serve", *flags]), parser.parse_args(["plan", *flags])
        assert engine_config(plan) == engine_config(serve)
    assert engine_config(plan).batching == "static"


def test_slo_attainment_and_parsing() -> None:
    slo = parse_slo("ttft=2000,itl=200,e2e=60")
    assert slo == SLO(2.0, 0.2, 60.0)
    with pytest.raises(ValueError):
        parse_slo("ttft=-1")
    sim = Simulator(SimConfig(num_blocks=64), constant_model())
    res = sim.run([PlannedRequest(0.0, 10, 10), PlannedRequest(100.0, 10, 100)])
    assert attainment(res, SLO(e2e=1.0)) == 0.5  # 10 vs 100 steps of 50 ms


@pytest.mark.parametrize("threshold", [0.013, 0.7, 3.7, 250.0])
def test_bisection_finds_the_highest_rate_meeting_the_slo(threshold: float) -> None:
    calls: list[float] = []

    def meets(rate: float) -> bool:
        calls.append(rate)
        return rate <= threshold

    found = bisect_rate(meets, start=0.5, rel_tol=0.02)
    assert found is not None and threshold / 1.02 <= found <= threshold
    assert len(calls) < 30
    assert bisect_rate(lambda r: False) is None


def test_serving_overhead_adds_per_step_and_per_sequence() -> None:
    from planner.cli import parse_overhead

    assert parse_overhead("3,1.1") == pytest.approx((0.003, 0.0011))
    for bad in ("3", "3,x", "-1,1", "1,inf"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_overhead(bad)
    alone = StepTimeModel([0.05, 0.001, 0.0, 0.0001, 0.0, 0.01, 0.003], fused_decode_limit=16)
    served = dataclasses.replace(alone, overhead_s=0.003, overhead_per_seq_s=0.001)
    for work, seqs in ((StepWork(1, 100), 1), (StepWork(40, 4000), 40), (StepWork(8, 800, 64, 4096), 9)):
        assert served.predict(work) == pytest.approx(alone.predict(work) + 0.003 + 0.001 * seqs)


def test_the_serving_overhead_is_fitted_through_two_probes() -> None:
    from planner.overhead import fit_overhead

    # 1 sequence: 3.1 ms more than the engine alone; 16 sequences: 11.8 ms more
    per_step, per_seq = fit_overhead([(1, 0.0031), (16, 0.0118)])
    assert per_seq == pytest.approx(0.00058) and per_step == pytest.approx(0.00252)
    # probes faster than the engine alone add nothing, and never a negative cost
    assert fit_overhead([(1, -0.002), (16, -0.001)]) == (0.0, pytest.approx(0.001 / 15))
    assert fit_overhead([(1, 0.004), (16, 0.001)]) == (0.004, 0.0)
    with pytest.raises(ValueError, match="different batch sizes"):
        fit_overhead([(4, 0.001), (4, 0.002)])


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (tiny) calibration of the default model on the CPU."""
    from engine.config import EngineConfig
    from planner.calibrate import Grid, calibrate

    model = calibrate(EngineConfig(kv_cache_memory="64MiB", device="cpu", quantization="none"),
                      Grid((1, 2), (16,), (16,), 1), log=lambda _: None)
    path = tmp_path_factory.mktemp("plan") / "fit.json"
    model.save(path)
    return path


@pytest.mark.slow
def test_calibration_times_real_steps(calibrated: Path) -> None:
    data = json.loads(calibrated.read_text())
    assert data["features"] == list(FEATURES)
    assert data["meta"]["steps"] >= len(FEATURES)
    assert data["device"] == "cpu" and data["meta"]["model"] == "SmolLM2-135M-Instruct"
    model = StepTimeModel.load(calibrated)
    assert model.predict(StepWork(1, 100)) > 0
    # more work never takes less time
    assert model.predict(StepWork(8, 800, 256, 256 * 256)) >= model.predict(StepWork(1, 100))


@pytest.mark.slow
def test_pagode_plan_json(calibrated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from server.cli import main

    rc = main(["plan", "--device", "cpu", "--fit", str(calibrated), "--kv-cache-memory", "512MiB",
               "--num-prompts", "20", "--rate", "0.5", "--slo", "ttft=60000,itl=60000", "--json"])
    assert rc == 0
    plan = json.loads(capsys.readouterr().out)
    from engine import native

    assert plan["cpu"] == native.cpu_target().describe()  # the device line names the CPU
    # the KV dtype pagode serve uses on the CPU by default (auto: fp16), 2 bytes a value
    assert plan["kv_cache_dtype"] == "fp16"
    assert plan["memory"]["kv_bytes_per_token"] == 23_040
    assert plan["memory"]["num_blocks"] == 512 * 2**20 // (23_040 * 16)
    pred = plan["prediction"]
    assert pred["completed"] == 20 and pred["output_throughput"] > 0
    assert pred["ttft_s"]["p50"] <= pred["ttft_s"]["p99"] <= pred["e2e_s"]["p99"]
    slo = pred["slo"]
    assert slo["holds"] == (slo["attainment"] >= 0.99)
    assert slo["capacity_rate"] is None or slo["capacity_rate"] > 0
    assert pred["advice"]["next_step"] in ("more KV memory", "more replicas")


def test_a_windowed_model_holds_only_its_window_in_the_simulated_cache() -> None:
    """With every layer windowed, the planner frees blocks as the engine does: a long
    generation's peak usage is its window's blocks, not its whole context's."""
    specs = [PlannedRequest(0.0, 40, 200)]
    full = Simulator(SimConfig(num_blocks=64), constant_model(), check_invariants=True).run(specs)
    windowed = Simulator(SimConfig(num_blocks=64, kv_window=24), constant_model(), check_invariants=True).run(specs)
    assert full.max_kv_usage * 64 >= -(-240 // 16)
    assert windowed.max_kv_usage * 64 <= -(-24 // 16) + 2 + 1  # the prompt's blocks are held until it is computed
