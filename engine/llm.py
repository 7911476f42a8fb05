"""Offline generation: `LLM(...).generate(prompts, params)`."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from collections.abc import Sequence as Seq

from engine.arg_utils import offline_config
from engine.llm_engine import LLMEngine
from engine.progress import progress
from engine.sampling_params import SamplingParams, expand_choices
from engine.types.outputs import CompletionOutput, RequestOutput, StreamDelta, TokenLogprob

Prompt = str | list[int]


class LLM:
    """Offline generation on the engine `pagode serve` would build for the same model and
    settings (engine/arg_utils.py's offline_config): `quantization="none"` asks for fp32,
    token-for-token equal to transformers; the default is the server's fast `auto`."""

    def __init__(self, model: str | None = None, **kwargs: object) -> None:
        self.engine = LLMEngine(offline_config(model=model, **kwargs))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(self, prompts: Prompt | Seq[Prompt], params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = False, lora_name: str | Seq[str | None] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order; n > 1 fans out into n choices. `lora_name`:
        the adapter every prompt runs on, or one per prompt (None: the base model)."""
        prompt_list = _as_prompt_list(prompts)
        param_list = _as_param_list(params, len(prompt_list))
        loras = [lora_name] * len(prompt_list) if lora_name is None or isinstance(lora_name, str) else list(lora_name)
        groups: list[list[str]] = []
        for prompt, p, lora in zip(prompt_list, param_list, loras, strict=True):
            groups.append([self._add(prompt, choice, lora) for choice in expand_choices(p)])
        done = self._run_to_completion(sum(p.n for p in param_list), use_tqdm)
        return [self._collect(prompt, ids, done) for prompt, ids in zip(prompt_list, groups, strict=True)]

    def _add(self, prompt: Prompt, params: SamplingParams, lora_name: str | None = None) -> str:
        request_id = str(next(self._ids))
        self.engine.add_request(request_id, prompt, params, lora_name=lora_name)
        return request_id

    def _run_to_completion(self, total: int, show: bool) -> dict[str, RequestOutput]:
        done: dict[str, RequestOutput] = {}
        texts: dict[str, list[str]] = {}
        tokens: dict[str, list[int]] = {}
        prompt_lps: dict[str, list[TokenLogprob | None]] = {}
        lps: dict[str, list[TokenLogprob]] = {}
        for deltas in progress(self._steps(), total=None, description="generating", enabled=show):
            for d in deltas:
                texts.setdefault(d.request_id, []).append(d.text)
                tokens.setdefault(d.request_id, []).extend(d.token_ids)
                if d.logprobs is not None:
                    lps.setdefault(d.request_id, []).extend(d.logprobs)
                if d.prompt_logprobs is not None:
                    prompt_lps[d.request_id] = d.prompt_logprobs
                if not d.finished:
                    continue
                if d.error:
                    raise RuntimeError(f"request {d.request_id} failed: {d.error}")
                output = CompletionOutput(0, "".join(texts.pop(d.request_id)), tokens.pop(d.request_id),
                                          d.finish_reason, d.stop_reason, lps.pop(d.request_id, None))
                done[d.request_id] = RequestOutput(d.request_id, None, d.prompt_token_ids, [output], d.times,
                                                   prompt_logprobs=prompt_lps.pop(d.request_id, None))
        return done

    def _steps(self) -> Iterator[list[StreamDelta]]:
        while self.engine.has_unfinished():
            yield self.engine.step()

    def _collect(self, prompt: Prompt, ids: list[str], done: dict[str, RequestOutput]) -> RequestOutput:
        choices = [dataclasses.replace(done[rid].outputs[0], index=i) for i, rid in enumerate(ids)]
        first = done[ids[0]]
        return RequestOutput(ids[0], prompt if isinstance(prompt, str) else None,
                             first.prompt_token_ids, choices, first.times,
                             prompt_logprobs=first.prompt_logprobs)


def _as_prompt_list(prompts: Prompt | Seq[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and isinstance(items[0], int):
        return [list(items)]  # type: ignore[arg-type]
    return items  # type: ignore[return-value]


def _as_param_list(params: SamplingParams | Seq[SamplingParams] | None, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams() for _ in range(n)]
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
    return list(params)
