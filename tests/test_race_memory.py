"""Race results kept across starts (engine/tuning/race_memory.py): a second load on the same machine
races nothing and gives the same tokens; a changed machine, --warmup or PAGODE_RACE_CACHE=0
races again; a broken cache file costs a race, not a start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests_support import cache_sharing_builds
from tiny_models import TinyZoo, one_torch_thread, prompts, tiny_spec

from engine import envs, native
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from engine.tuning import fused_step, gemm_choice, kernel_crossover, prefill_kernel, race_memory, timing
from engine.types.info import KernelChoice

LLAMA = tiny_spec("llama", "LlamaConfig", "LlamaForCausalLM", "llama")
ARGS: dict[str, Any] = dict(kv_cache_memory="16MiB", max_model_len=128, max_num_seqs=8, quantization="int8")


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache with nothing measured (the compiled kernels linked in, as built), and no result
    of this process's earlier loads."""
    monkeypatch.setenv("PAGODE_CACHE_DIR", str(cache_sharing_builds(tmp_path / "cache", envs.CACHE_DIR.get())))
    monkeypatch.delenv("PAGODE_QUANT_CROSSOVER", raising=False)
    monkeypatch.delenv("PAGODE_RACE_CACHE", raising=False)
    monkeypatch.setenv("PAGODE_QUANT_GEMM", "auto")
    forget_this_process(monkeypatch)
    return tmp_path / "cache"


def forget_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_crossover, "_cache", {})
    monkeypatch.setattr(kernel_crossover, "_tile_from", {})
    monkeypatch.setattr(gemm_choice, "_winners", {})
    monkeypatch.setattr(fused_step, "_limits", {})
    monkeypatch.setattr(prefill_kernel, "_winners", {})
    monkeypatch.setattr(race_memory, "_fresh", False)  # each engine sets it from its --warmup
    monkeypatch.setattr(race_memory, "_taken", {})


def count_races(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every race the engine runs from now on, by kind, through timing's two entry points."""
    races: list[str] = []
    crossover, fastest = timing.crossover, timing.fastest

    def counted_crossover(*args: Any, **kwargs: Any) -> timing.Crossover:
        races.append("crossover")
        return crossover(*args, **kwargs)

    def counted_fastest(*args: Any, **kwargs: Any) -> tuple[str, dict[str, float]]:
        races.append("fastest")
        return fastest(*args, **kwargs)

    monkeypatch.setattr(timing, "crossover", counted_crossover)
    monkeypatch.setattr(timing, "fastest", counted_fastest)
    return races


def greedy(folder: Path, **extra: Any) -> tuple[list[list[int]], tuple[KernelChoice, ...]]:
    """The tokens of three greedy prompts, and what the load's kernel races chose."""
    llm = LLM(model=str(folder), **ARGS, **extra)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    return [out.outputs[0].token_ids for out in llm.generate(prompts(3, seed=4), params)], llm.engine.tuning.kernels


def choices(kernels: tuple[KernelChoice, ...]) -> dict[tuple[str, str], str]:
    return {(k.race, k.key): k.choice for k in kernels}


def test_a_second_load_reads_the_races_back(tiny_zoo: TinyZoo, own_cache: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert native.block_linear() is not None, "no CPU kernels here: nothing to race"
    folder = tiny_zoo.folder(LLAMA)
    races = count_races(monkeypatch)
    with one_torch_thread():
        first, measured = greedy(folder)
        assert "crossover" in races, "the first load on an empty cache measured nothing"
        kept = list((own_cache / "races").glob("*.json"))
        assert len(kept) == 1, kept
        races.clear()
        forget_this_process(monkeypatch)
        second, read_back = greedy(folder)
        assert races == [], f"a second load on the same machine raced again: {races}"
        assert second == first
        # the engine's tuning lists every kernel race: measured at the first start, read back
        # at the second, with the same winners
        assert {k.race for k in measured} >= {"block-kernel", "big-step-gemm", "prefill-attention"}
        assert {k.source for k in measured} == {"measured"} and {k.source for k in read_back} == {"kept"}
        assert choices(read_back) == choices(measured)
        forget_this_process(monkeypatch)
        _, raced_again = greedy(folder, warmup=True)
        assert {k.source for k in raced_again} == {"measured"}
        assert "crossover" in races, "--warmup read the kept results instead of racing"


def test_another_machine_races_again(own_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    race_memory.keep("block-kernel", "q8_0:64:64", 16)
    assert race_memory.recall("block-kernel", "q8_0:64:64") == 16
    here = race_memory.machine()
    monkeypatch.setattr(race_memory, "machine", lambda: {**here, "kernels": "another-build.so"})
    assert race_memory.recall("block-kernel", "q8_0:64:64") is None
    monkeypatch.setattr(race_memory, "machine", lambda: {**here, "threads": here["threads"] + 1})
    assert race_memory.recall("block-kernel", "q8_0:64:64") is None


def test_warmup_and_the_switch_keep_results_out(own_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    race_memory.keep("big-step-gemm", "64:64:fp32:onednn", "onednn")
    race_memory.race_again(True)
    try:
        assert race_memory.recall("big-step-gemm", "64:64:fp32:onednn") is None
    finally:
        race_memory.race_again(False)
    monkeypatch.setenv("PAGODE_RACE_CACHE", "0")
    assert race_memory.recall("big-step-gemm", "64:64:fp32:onednn") is None
    race_memory.keep("big-step-gemm", "other", "fp32")
    monkeypatch.delenv("PAGODE_RACE_CACHE")
    assert race_memory.recall("big-step-gemm", "other") is None


def test_a_broken_cache_file_costs_a_race_not_a_start(own_cache: Path) -> None:
    path = race_memory.path_for(race_memory.machine())
    path.parent.mkdir(parents=True)
    path.write_text("{not json", encoding="utf-8")
    assert race_memory.recall("block-kernel", "q8_0:64:64") is None
    race_memory.keep("block-kernel", "q8_0:64:64", 8)
    assert race_memory.recall("block-kernel", "q8_0:64:64") == 8


def test_the_speculation_cost_curve_is_kept_when_plausible(tiny_zoo: TinyZoo, own_cache: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A speculating engine times its step cost curves once per machine: a second start reads
    them back, unless the first timings looked like a busy machine's (then it times again)."""
    from engine.speculative_config import parse_speculative_config
    from engine.tuning import step_cost

    timed: list[list[int]] = []
    real = step_cost._time_counts

    def counted(steps: Any, counts: list[int]) -> step_cost.StepCost:
        timed.append(counts)
        return real(steps, counts)

    monkeypatch.setattr(step_cost, "_time_counts", counted)
    monkeypatch.setattr(step_cost, "_measured", {})
    config = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 2}')

    def curve() -> step_cost.StepCost:
        drafter = LLM(model=str(tiny_zoo.folder(LLAMA)), **ARGS, speculative_config=config).engine.scheduler.drafter
        assert drafter is not None
        return drafter.cost

    with one_torch_thread():
        first = curve()
        assert len(timed) == 1
        monkeypatch.setattr(step_cost, "_measured", {})
        forget_this_process(monkeypatch)
        second = curve()
    if step_cost.plausible(first):
        assert len(timed) == 1 and second == first
    else:
        assert len(timed) == 2
