"""`pagode-loadgen compare DIR1 DIR2 ...`: one table across saved runs, with ratios.

Each run is compared with the run of the first directory at the same offered rate
(or at the same position when the rates differ).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loadgen.report import fmt, load_results

# (column, path into the summary, scale to display)
COLUMNS: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("req/s", ("request_throughput",), 1.0),
    ("out tok/s", ("output_throughput",), 1.0),
    ("TTFT p50 ms", ("ttft_s", "p50"), 1e3),
    ("TTFT p99 ms", ("ttft_s", "p99"), 1e3),
    ("ITL p99 ms", ("itl_s", "p99"), 1e3),
    ("TPOT p50 ms", ("tpot_s", "p50"), 1e3),
    ("E2E p50 s", ("e2e_s", "p50"), 1.0),
    ("E2E p99 s", ("e2e_s", "p99"), 1.0),
)


def lookup(summary: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = summary
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, int | float) else None


def ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def baseline_for(run: dict[str, Any], position: int, base_runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    same_rate = [r for r in base_runs if r["offered_rate"] == run["offered_rate"]]
    if same_rate:
        return same_rate[0]
    return base_runs[position] if position < len(base_runs) else None


def compare_rows(results: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (directory, rate): values and their ratios to the baseline."""
    base_runs = results[0][1]["runs"]
    rows = []
    for name, data in results:
        for pos, run in enumerate(data["runs"]):
            base = baseline_for(run, pos, base_runs)
            row: dict[str, Any] = {"run": name, "offered_rate": run["offered_rate"]}
            for col, path, _ in COLUMNS:
                row[col] = lookup(run["summary"], path)
                row[f"{col} ratio"] = ratio(row[col], lookup(base["summary"], path) if base else None)
            rows.append(row)
    return rows


def compare_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="Comparison (ratio to the first run at the same rate)")
    table.add_column("run")
    table.add_column("offered", justify="right")
    for col, _, _ in COLUMNS:
        table.add_column(col, justify="right")
    for row in rows:
        cells = []
        for col, _, scale in COLUMNS:
            r = row[f"{col} ratio"]
            cells.append(fmt(row[col], scale) + ("" if r is None else f" (x{r:.2f})"))
        table.add_row(row["run"], str(row["offered_rate"]), *cells)
    return table


def run_compare(dirs: list[str], console: Console) -> int:
    if not dirs:
        console.print("[red]compare needs at least one results directory[/]")
        return 2
    results = [(d, load_results(Path(d))) for d in dirs]
    console.print(compare_table(compare_rows(results)))
    return 0
