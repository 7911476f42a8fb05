"""PNG plots, drawn with matplotlib's Agg backend (no display needed).

Every function takes labelled runs as stored in results.json, so plots can be redrawn
from saved results and runs of different servers can share one figure.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
import numpy as np  # noqa: E402

LabeledRun = tuple[str, dict[str, Any]]
CDF_METRICS = (("TTFT (s)", "ttft"), ("ITL (s)", "itl"), ("E2E (s)", "e2e"))


def latency_values(run: dict[str, Any], key: str) -> list[float]:
    ok = [r for r in run["requests"] if r["success"]]
    if key == "itl":
        return [b - a for r in ok for a, b in zip(r["content_times"], r["content_times"][1:], strict=False)]
    return [r[key] for r in ok if r.get(key) is not None]


def plot_cdfs(runs: list[LabeledRun], path: Path) -> Path:
    """Empirical CDFs of TTFT, ITL and E2E, one line per run."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (title, key) in zip(axes, CDF_METRICS, strict=True):
        for label, run in runs:
            values = np.sort(latency_values(run, key))
            if len(values):
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=label)
        ax.set_xlabel(title)
        ax.set_ylabel("fraction of requests" if key != "itl" else "fraction of gaps")
        ax.set_xscale("log")
        ax.grid(True, alpha=0.3)
    add_legend(axes[0])
    return save(fig, path)


def finite_rate_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    finite = [r for r in runs if isinstance(r["offered_rate"], int | float) and math.isfinite(r["offered_rate"])]
    return sorted(finite, key=lambda r: r["offered_rate"])


def plot_latency_vs_rate(series: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """TTFT, ITL and E2E p50 and p99 against the offered rate, one line pair per series."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (title, key) in zip(axes, CDF_METRICS, strict=True):
        for name, runs in series.items():
            pts = finite_rate_runs(runs)
            rates = [r["offered_rate"] for r in pts]
            for q, style in (("p50", "-o"), ("p99", "--s")):
                ax.plot(rates, [r["summary"][f"{key}_s"][q] or np.nan for r in pts], style,
                        label=f"{name} {q}".strip())
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(title)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    add_legend(axes[0])
    return save(fig, path)


def plot_throughput_vs_rate(series: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """Achieved request and output-token throughput against the offered rate."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, runs in series.items():
        pts = finite_rate_runs(runs)
        rates = [r["offered_rate"] for r in pts]
        axes[0].plot(rates, [r["summary"]["request_throughput"] for r in pts], "-o", label=name or None)
        axes[1].plot(rates, [r["summary"]["output_throughput"] for r in pts], "-o", label=name or None)
    if pts := [r for runs in series.values() for r in finite_rate_runs(runs)]:
        top = max(r["offered_rate"] for r in pts)
        axes[0].plot([0, top], [0, top], ":", color="grey", label="offered")
    axes[0].set_ylabel("completed req/s")
    axes[1].set_ylabel("output tokens/s")
    for ax in axes:
        ax.set_xlabel("offered rate (req/s)")
        ax.grid(True, alpha=0.3)
        add_legend(ax)
    return save(fig, path)


def plot_timelines(runs: list[LabeledRun], path: Path) -> Path:
    """Queue depth, running batch size and KV usage over time, from /metrics scrapes."""
    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    rows = (("waiting", "queue depth"), ("running", "running seqs"), ("kv_usage", "KV usage (0-1)"))
    for ax, (key, title) in zip(axes, rows, strict=True):
        for label, run in runs:
            pts = [(s["t"], s[key]) for s in run.get("timeline", []) if s.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), label=label, drawstyle="steps-post")
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("time since run start (s)")
    if any(run.get("timeline") for _, run in runs):
        add_legend(axes[0])
    return save(fig, path)


def add_legend(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_results(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """The plots of one loadgen run (one or several offered rates)."""
    runs = results["runs"]
    labeled = [(f"rate {r['offered_rate']}", r) for r in runs]
    paths = [plot_cdfs(labeled, out_dir / "latency_cdf.png")]
    if len(finite_rate_runs(runs)) >= 2:
        series = {"": runs}
        paths.append(plot_latency_vs_rate(series, out_dir / "latency_vs_rate.png"))
        paths.append(plot_throughput_vs_rate(series, out_dir / "throughput_vs_rate.png"))
    if any(r.get("timeline") for r in runs):
        paths.append(plot_timelines(labeled, out_dir / "server_timeline.png"))
    return paths
