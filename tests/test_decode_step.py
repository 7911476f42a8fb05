"""The fused C++ decode step (engine/model/decode_step.py) against the layer-by-layer path.

With every projection pinned to the block kernel, both paths compute with the same C++
functions, so on the real model and a real batch of requests of different lengths they
must pick the same tokens with the same log-probs, to the bit; and the step must really
have run. (Unpinned, the layer-by-layer path moves some projections to BLAS.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from engine import native
from engine.llm import LLM
from engine.model import decode_step
from engine.model.decode_step import FusedDecodeStep
from engine.quant.linear import pinned_path
from engine.sampling_params import SamplingParams
from engine.tuning import fused_step, timing
from engine.types.outputs import RequestOutput
from loadgen.prose import prose_token_ids

pytestmark = pytest.mark.skipif(native.decode_step() is None, reason="no C++ compiler")


@pytest.fixture(scope="module", params=[("int4", "fp16"), ("int8", "fp32"), ("int4", "int8")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def quantized_llm(request: pytest.FixtureRequest) -> Iterator[LLM]:
    mode, kv = request.param
    # No prefix cache: the second run's prefills must compute what the first run's did, not
    # read its fp16 or int8 blocks back.
    yield LLM(quantization=mode, kv_cache_dtype=kv, kv_cache_memory="64MiB", max_model_len=512, max_num_seqs=8,
              enable_prefix_caching=False)


def generate(llm: LLM, prompts: list[list[int]]) -> list[RequestOutput]:
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=5)
    return llm.generate(prompts, params)


def test_the_race_stops_at_its_biggest_step_and_runs_bigger_ones_layer_by_layer(
        quantized_llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = quantized_llm.engine.runner
    step = runner.decode_step
    assert isinstance(step, FusedDecodeStep)
    monkeypatch.setenv("PAGODE_RACE_CACHE", "0")
    monkeypatch.setattr(fused_step, "_limits", {})
    monkeypatch.setattr(fused_step, "RACE_MAX_DECODES", 4)
    limit = decode_step.measure_limit(step, runner.model, runner.kv_caches, 256)
    assert sorted(limit.timings_ms) == [1, 2, 4], limit.timings_ms  # never 8 and up
    assert limit.max_kernel_tokens <= 4  # even where the fused step won every count


def test_fused_step_gives_the_layer_by_layer_tokens_and_logprobs(quantized_llm: LLM) -> None:
    runner = quantized_llm.engine.runner
    step = runner.decode_step
    assert isinstance(step, FusedDecodeStep)
    # The load-time race set the step's limit by the crossover rule on the timings it took.
    # Which path wins at each count is the machine's business (a busy one can reverse
    # them), so that is the benchmark's to report, not something to assert here.
    limit = decode_step.measure_limit(step, runner.model, runner.kv_caches, 8)
    assert limit.timings_ms and min(limit.timings_ms) == 1, limit.timings_ms
    decided = timing.Crossover(-1, dict(limit.timings_ms))
    decided.decide()
    assert step.max_tokens == limit.max_kernel_tokens == decided.max_kernel_tokens, limit.timings_ms
    step.max_tokens = 8  # every decode step of this batch takes it
    batches: list[int] = []
    hook = step.register_forward_hook(lambda mod, args, out: batches.append(out.shape[0]))
    prompts = prose_token_ids(quantized_llm.engine.tokenize, [7, 40, 23], seed=3)
    try:
        with pinned_path(quantized_llm.engine.runner.model, "kernel"):  # the prefills too: each path's first token
            fused = generate(quantized_llm, prompts)
            runner.decode_step = None
            layered = generate(quantized_llm, prompts)
    finally:
        runner.decode_step = step
        hook.remove()
    assert batches == [3] * 19, batches  # every decode step of the batch ran fused
    for a, b in zip(fused, layered, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].logprobs == b.outputs[0].logprobs


def test_fused_step_output_is_the_final_norm_of_the_last_layer(quantized_llm: LLM) -> None:
    """Synthetic decodes straight through both paths: the hidden states agree bit for bit."""
    runner = quantized_llm.engine.runner
    step = runner.decode_step
    assert isinstance(step, FusedDecodeStep)
    ids, positions, meta = decode_step.synthetic_decodes(4, runner.block_size, step.embedding.shape[0])
    with pinned_path(quantized_llm.engine.runner.model, "kernel"), torch.inference_mode():
        got = step(ids, positions, meta)
        expected = runner.model(ids, positions, meta, runner.kv_caches)
    assert torch.equal(got, expected)


def test_fused_step_runs_the_bf16_gemm_where_the_layers_do(quantized_llm: LLM) -> None:
    """Past a projection's crossover the layer-by-layer path runs the bf16 GEMM on the dense
    copy; the fused step runs the same kernel there, so the hidden states agree bit for bit,
    and they are not the blocks' (the dense copy really ran)."""
    runner = quantized_llm.engine.runner
    step = runner.decode_step
    assert isinstance(step, FusedDecodeStep)
    m = 16
    dense = [p for p in step.projections[0] if (steps := p.amx_gemm_steps()) and steps[0] <= m <= steps[1]]
    if not dense:
        pytest.skip(f"no projection runs pagode's bf16 GEMM at {m} tokens here")
    ids, positions, meta = decode_step.synthetic_decodes(m, runner.block_size, step.embedding.shape[0])
    with torch.inference_mode():
        got = step(ids, positions, meta)
        expected = runner.model(ids, positions, meta, runner.kv_caches)
        with pinned_path(runner.model, "kernel"):
            on_blocks = step(ids, positions, meta)
    assert torch.equal(got, expected)
    assert not torch.equal(got, on_blocks)


def test_unquantized_models_run_layer_by_layer(small_llm: LLM) -> None:
    assert small_llm.engine.runner.decode_step is None


def test_the_step_profiler_times_the_fused_step_through_the_runner(quantized_llm: LLM) -> None:
    engine = quantized_llm.engine
    tables: list[str] = []
    profiler = engine.enable_step_profile(5, tables.append)
    try:
        generate(quantized_llm, [[5, 6, 7, 8]])
    finally:
        profiler.close()
        engine.step_listeners.remove(profiler.on_step)
    rows = [line for line in tables[-1].splitlines() if line.startswith("  all layers in one C++ call")]
    assert rows and float(rows[0].split()[-2]) > 0, tables[-1]


def test_the_sdpa_backend_never_takes_the_fused_step() -> None:
    llm = LLM(attention_backend="sdpa", quantization="int4", kv_cache_memory="8MiB", max_model_len=128)
    assert llm.engine.runner.backend.name == "sdpa"
    assert llm.engine.runner.decode_step is None
