"""Render the pagode Grafana dashboard with matplotlib, from a real scrape.

Grafana cannot run here, but Prometheus can. This script runs the dashboard's own
PromQL, panel by panel, on a real Prometheus that scraped a real `pagode serve` while
pagode-loadgen drove it, and draws each panel where Grafana would (gridPos), with
the panel titles, legends and units of docker/grafana/dashboards/pagode.json.

    python -m benchmarks.render_dashboard                  # starts its own server
    python -m benchmarks.render_dashboard --url http://127.0.0.1:8000 --no-load

Without --url it starts `pagode serve` on a loopback port with a small
KV cache and a bounded queue, so that preemptions and 429s show on the dashboard too.
Needs the `prometheus` binary (scripts/install-deploy-tools.sh installs it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx
import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402 - after the backend is chosen
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from benchmarks.pagode_server import REPO_ROOT, running_server  # noqa: E402
from loadgen.server_process import running_command  # noqa: E402

DASHBOARD = REPO_ROOT / "docker" / "grafana" / "dashboards" / "pagode.json"
SCRAPE_INTERVAL_S = 1
RATE_INTERVAL = "20s"  # Grafana's $__rate_interval for the 5 s scrape of docker/prometheus.yml
SERVER_ARGS = ["--kv-cache-memory", "32MiB", "--max-model-len", "512",
               "--max-num-queued-reqs", "8", "--disable-access-log"]
# Grafana's dark theme and its classic palette.
BACKGROUND, PANEL, GRID, TEXT = "#111217", "#181b1f", "#2c3235", "#ccccdc"
PALETTE = ["#73BF69", "#FADE2A", "#5794F2", "#FF9830", "#F2495C", "#B877D9", "#8AB8FF", "#FFB357"]


@contextmanager
def prometheus(target: str, workdir: Path) -> Iterator[str]:
    """A Prometheus scraping `target` (host:port) every SCRAPE_INTERVAL_S, ready for queries."""
    exe = shutil.which("prometheus")
    if exe is None:
        raise SystemExit("prometheus not found: run scripts/install-deploy-tools.sh (as root)")
    config = workdir / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "pagode", "static_configs": [{"targets": [target]}]}],
    }), encoding="utf-8")

    def command(port: int) -> list[str]:
        return [exe, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}"]

    with running_command(command, workdir / "prometheus.log", 60, health_path="/-/ready", grace=30) as url:
        yield url


def run_loadgen(url: str, workdir: Path, name: str, rate: str, num_prompts: int) -> None:
    argv = [sys.executable, "-m", "loadgen.cli", "--url", url, "--rate", rate,
            "--num-prompts", str(num_prompts), "--input-len", "32:192", "--output-len", "16:128",
            "--seed", str(len(name)), "--out", str(workdir / name), "--no-progress", "--no-plots"]
    print(f"loadgen {name}: rate {rate}, {num_prompts} prompts", flush=True)
    subprocess.run(argv, cwd=REPO_ROOT, check=False, stdout=subprocess.DEVNULL, timeout=600)


def drive_load(url: str, workdir: Path) -> None:
    """A steady phase, then a burst past the KV cache and the queue bound, then rest."""
    time.sleep(5)
    run_loadgen(url, workdir, "steady", "0.7", 30)
    run_loadgen(url, workdir, "burst", "inf", 16)
    time.sleep(8)


def query_range(prom: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    resp = httpx.get(f"{prom}/api/v1/query_range", timeout=30,
                     params={"query": expr, "start": start, "end": end, "step": SCRAPE_INTERVAL_S})
    body = resp.json()
    if body.get("status") != "success":
        raise SystemExit(f"Prometheus rejected {expr!r}: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def unit_formatter(unit: str) -> FuncFormatter:
    def seconds(v: float, _: Any) -> str:
        return f"{v * 1000:.0f} ms" if abs(v) < 1 else f"{v:.3g} s"

    formats = {
        "s": seconds,
        "percentunit": lambda v, _: f"{v * 100:.0f}%",
        "reqps": lambda v, _: f"{v:.3g} req/s",
    }
    return FuncFormatter(formats.get(unit, lambda v, _: f"{v:.3g}"))


def style_axes(ax: Axes, title: str, unit: str) -> None:
    ax.set_facecolor(PANEL)
    ax.set_title(title, color=TEXT, fontsize=10, loc="left", fontweight="bold", pad=6)
    ax.tick_params(colors=TEXT, labelsize=7)
    for spine in ax.spines.values():
        spine.set_color(GRID)
    ax.grid(color=GRID, linewidth=0.6)
    ax.yaxis.set_major_formatter(unit_formatter(unit))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))


def draw_panel(ax: Axes, panel: dict[str, Any], prom: str, start: float, end: float) -> None:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    style_axes(ax, panel["title"], unit)
    color = 0
    for target in panel["targets"]:
        for series in query_range(prom, target["expr"], start, end):
            times = mdates.date2num([dt.datetime.fromtimestamp(float(t)) for t, _ in series["values"]])
            values = [float(v) for _, v in series["values"]]
            ax.plot(times, values, color=PALETTE[color % len(PALETTE)], linewidth=1.4,
                    label=legend(target.get("legendFormat", ""), series["metric"]))
            ax.fill_between(times, values, color=PALETTE[color % len(PALETTE)], alpha=0.08)
            color += 1
    if color == 0:
        ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(loc="upper left", fontsize=7, facecolor=PANEL, edgecolor=GRID,
                  labelcolor=TEXT, framealpha=0.8)
    ax.set_ylim(bottom=0)  # after plotting, so that the top still autoscales
    ax.set_xlim(float(mdates.date2num(dt.datetime.fromtimestamp(start))),
                float(mdates.date2num(dt.datetime.fromtimestamp(end))))


def render(prom: str, start: float, end: float, out: Path, note: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    header = 1.1  # inches above the grid
    width, height_per_unit = 20.0, 0.42
    fig = plt.figure(figsize=(width, header + rows * height_per_unit), facecolor=BACKGROUND)
    total_h = header + rows * height_per_unit
    fig.text(0.01, 1 - 0.35 / total_h, f"{dashboard['title']} — Grafana dashboard "
             f"(docker/grafana/dashboards/pagode.json)", color=TEXT, fontsize=15,
             fontweight="bold", va="center")
    fig.text(0.01, 1 - 0.75 / total_h, note, color="#9fa7b3", fontsize=9.5, va="center")
    for panel in panels:
        pos = panel["gridPos"]
        # Room for the y tick labels on the left, the title above, the times below.
        left = pos["x"] / 24 + 0.045
        right = (pos["x"] + pos["w"]) / 24 - 0.008
        top = 1 - (header + pos["y"] * height_per_unit + 0.32) / total_h
        bottom = 1 - (header + (pos["y"] + pos["h"]) * height_per_unit - 0.30) / total_h
        ax = fig.add_axes((left, bottom, right - left, top - bottom))
        draw_panel(ax, panel, prom, start, end)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, facecolor=BACKGROUND)
    plt.close(fig)


def prometheus_version() -> str:
    exe = shutil.which("prometheus") or "prometheus"
    first = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"version (\S+)", first)
    return match.group(1) if match else "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.render_dashboard",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running pagode server (default: start one)")
    parser.add_argument("--no-load", action="store_true", help="scrape only; run no loadgen")
    parser.add_argument("--duration", type=float, default=60.0,
                        help="seconds to scrape with --no-load")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "dashboard.png")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pagode-dashboard-") as tmp:
        workdir = Path(tmp)
        server = running_server(SERVER_ARGS, workdir / "server.log") if args.url is None else nullcontext(args.url)
        with server as url, \
                prometheus(url.removeprefix("http://").removeprefix("https://"), workdir) as prom:
            start = time.time()
            if args.no_load:
                time.sleep(args.duration)
            else:
                drive_load(url, workdir)
            end = time.time()
            load = "" if args.no_load else (
                " while pagode-loadgen ran (0.7 req/s, then a burst past the queue bound)")
            note = ("matplotlib rendering of the pagode Grafana dashboard's queries from a real "
                    f"scrape: Prometheus {prometheus_version()} scraped a real `pagode serve` every "
                    f"{SCRAPE_INTERVAL_S} s{load}; $__rate_interval = {RATE_INTERVAL}; "
                    f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC")
            render(prom, start, end, args.out, note)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
