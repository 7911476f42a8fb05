"""Where one engine step's time goes: `--profile-steps N`.

A step listener sums the engine's phase timers (StepStats: packing, forward,
sampling, post-processing) over N steps, and forward hooks on the modules the model
runner runs (the model's and its fused decode step: ModelRunner.timed_modules) split
the forward by op class: linear projections, attention, norms/RoPE/activation
(with the K/V cache write), the lm_head, and the rest (embedding, glue). Callers may
add timers of their own (the server adds SSE/JSON encoding). Hooks exist only while
profiling, so an unprofiled step pays nothing. On CUDA the module timings would need
a device synchronize per hook; they are taken on the CPU only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import nn

from engine.model.decode_step import FusedDecodeStep
from engine.model.layers import PagedAttention, RMSNorm, RotaryCacheWrite, SiluAndMul
from engine.types.spec_counters import SpecCounters
from engine.types.stats import StepStats

if TYPE_CHECKING:
    from engine.runner.model_runner import ModelRunner

FORWARD_CLASSES = ("linears", "attention", "norms/rope/act + KV write", "all layers in one C++ call", "lm_head")


def op_class(name: str, module: nn.Module) -> str | None:
    """The op class a module's time is counted under, or None when it is not timed by itself."""
    if name.endswith("lm_head"):
        return "lm_head"
    if name.rsplit(".", 1)[-1].endswith("_proj"):
        return "linears"
    if isinstance(module, FusedDecodeStep):
        return "all layers in one C++ call"
    if isinstance(module, PagedAttention):
        return "attention"
    if isinstance(module, RMSNorm | RotaryCacheWrite | SiluAndMul):
        return "norms/rope/act + KV write"
    return None


@dataclass
class ProfileWindow:
    steps: int = 0
    tokens: int = 0
    decodes: int = 0
    spec: SpecCounters = field(default_factory=SpecCounters)  # drafts verified (engine/spec/)
    phases: dict[str, float] = field(default_factory=dict)
    ops: dict[str, float] = field(default_factory=dict)


class StepProfiler:
    """Collect N steps, hand a table to `report`, start again."""

    def __init__(self, runner: ModelRunner, every: int, report: Callable[[str], None],
                 extra: dict[str, Callable[[], float]] | None = None) -> None:
        self.every = every
        self.report = report
        self.extra = extra or {}  # name -> cumulative seconds, read at each window's ends
        self.window = ProfileWindow()
        self._extra_start = {k: f() for k, f in self.extra.items()}
        self._starts: dict[int, float] = {}
        self._handles = [h for name, m in runner.timed_modules() if (cls := op_class(name, m))
                         for h in self._hook(m, cls)]

    def _hook(self, module: nn.Module, cls: str) -> list:  # type: ignore[type-arg]
        def before(mod: nn.Module, args: object) -> None:
            self._starts[id(mod)] = time.perf_counter()

        def after(mod: nn.Module, args: object, out: object) -> None:
            dt = time.perf_counter() - self._starts.pop(id(mod), time.perf_counter())
            self.window.ops[cls] = self.window.ops.get(cls, 0.0) + dt

        return [module.register_forward_pre_hook(before), module.register_forward_hook(after)]

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def on_step(self, step: StepStats) -> None:
        w = self.window
        w.steps += 1
        w.tokens += step.num_tokens
        w.decodes += step.num_decodes
        w.spec.num_drafts += step.num_drafts
        w.spec.num_draft_tokens += step.num_draft_tokens
        w.spec.num_accepted_tokens += step.num_accepted_tokens
        for name in ("schedule", "prepare", "forward", "sample", "postprocess"):
            w.phases[name] = w.phases.get(name, 0.0) + getattr(step, f"{name}_time")
        w.phases["step"] = w.phases.get("step", 0.0) + step.step_time
        if w.steps >= self.every:
            self.report(self.table())
            self.window = ProfileWindow()
            self._extra_start = {k: f() for k, f in self.extra.items()}

    def table(self) -> str:
        w = self.window
        n = max(w.steps, 1)
        step = w.phases.get("step", 0.0) / n
        fwd = w.phases.get("forward", 0.0) / n
        rows: list[tuple[str, float]] = [
            ("schedule", w.phases.get("schedule", 0.0) / n),
            ("input packing", w.phases.get("prepare", 0.0) / n),
            ("forward (model + logits)", fwd),
        ]
        timed = 0.0
        for cls in FORWARD_CLASSES:
            t = w.ops.get(cls, 0.0) / n
            timed += t
            rows.append((f"  {cls}", t))
        rows.append(("  other (embedding, glue, Python)", max(fwd - timed, 0.0)))
        rows += [("sampling", w.phases.get("sample", 0.0) / n),
                 ("detokenize + stop checks", w.phases.get("postprocess", 0.0) / n)]
        accounted = sum(t for name, t in rows if not name.startswith("  "))
        rows.append(("engine bookkeeping (stats, deltas)", max(step - accounted, 0.0)))
        for name, read in self.extra.items():
            rows.append((f"{name} (outside the step)", (read() - self._extra_start[name]) / n))
        lines = [f"profile of {w.steps} steps: {w.tokens / n:.1f} tokens/step "
                 f"({w.decodes / n:.1f} decodes), {step * 1e3:.2f} ms/step",
                 f"{'phase':40s} {'ms/step':>9s} {'share':>7s}"]
        for name, t in rows:
            lines.append(f"{name:40s} {t * 1e3:9.3f} {t / step if step else 0.0:7.1%}")
        if w.spec.num_drafts:
            lines.append(spec_line(w.spec, n))
        return "\n".join(lines)


def spec_line(spec: SpecCounters, steps: int) -> str:
    """Speculative decoding over the window, with vLLM's two ratios."""
    return (f"speculative: {spec.num_drafts / steps:.1f} drafts/step, "
            f"{spec.num_draft_tokens / steps:.1f} draft tokens/step, "
            f"acceptance rate {spec.acceptance_rate:.1%}, "
            f"mean acceptance length {spec.mean_acceptance_length:.2f}")
