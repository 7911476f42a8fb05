"""The Grafana dashboard against a real pagode server.

Every metric name in the dashboard's PromQL must exist in a real scrape of a real
server's /metrics: a dashboard must never point at series the server does not export.
Then a real Prometheus scrapes that server and evaluates every panel's query, which
must return data. The Dockerfile's HEALTHCHECK command is run against the same server, the
session's shared one (tests/server_fixtures.py).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from server_fixtures import ServerProcess

from loadgen.server_process import free_port, stop

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "pagode.json"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


# --- PromQL: which metric names does an expression read? ----------------------------

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "and", "or", "unless", "inf", "nan", "atan2", "start", "end",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions,
    aggregations, keywords, label names or numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        before = text[match.start() - 1] if match.start() else " "
        after = text[match.end():].lstrip()
        if before.isdigit() or before == "." or after.startswith("("):
            continue  # an exponent (1e3) or a function/aggregation call
        if match.group(0).lower() in PROMQL_WORDS:
            continue
        names.add(match.group(0))
    return names


def grouping_labels(expr: str) -> set[str]:
    labels: set[str] = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels.update(x.strip() for x in group.split(",") if x.strip())
    return labels


def test_metric_names_reads_selectors_not_functions_or_labels() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, model_name) '
            '(rate(pagode:ttft_seconds_bucket{model_name=~"a|b", x!="rate(y)"}[$__rate_interval])))'
            ' / 1e3 + on (instance) group_left up offset 5m')
    assert metric_names(expr) == {"pagode:ttft_seconds_bucket", "up"}
    assert grouping_labels(expr) == {"le", "model_name"}
    assert metric_names("sum(rate(a_total[1m])) by (reason) / max(b)") == {"a_total", "b"}


def dashboard_targets() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [t | {"panel": p["title"]} for p in dashboard["panels"] for t in p.get("targets", [])]


# --- a real server ------------------------------------------------------------------


@pytest.fixture
def pagode_server(server: ServerProcess) -> str:
    """The session's shared server, with the shipped defaults: the dashboard must read only
    series that every pagode server exports, so it needs no server of its own."""
    return server.base_url


def model_name(url: str) -> str:
    name: str = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    return name


def stream_completion(url: str, model: str, prompt: str, max_tokens: int) -> str | None:
    """One streamed completion; its finish_reason."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "temperature": 0.8, "seed": 1}
    finish = None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    finish = choice.get("finish_reason") or finish
    return finish


def drive_traffic(url: str, count: int, max_tokens: int = 24) -> None:
    model = model_name(url)
    prompts = [f"Write a short note about topic number {i}." for i in range(count)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        finishes = list(pool.map(lambda p: stream_completion(url, model, p, max_tokens), prompts))
    assert all(f in ("stop", "length") for f in finishes), finishes


# --- a scrape ---------------------------------------------------------------------


def scrape(url: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """({family name as exposed: type}, {sample name: label names})."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    declared: dict[str, str] = {}
    samples: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            declared[name] = kind
        elif line and not line.startswith("#"):
            match = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?", line)
            assert match, line
            labels = set(re.findall(r'(\w+)="', match.group(2) or ""))
            samples.setdefault(match.group(1), set()).update(labels)
    return declared, samples


def histogram_family(name: str) -> str | None:
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


def test_dashboard_metrics_exist_in_a_real_scrape(pagode_server: str) -> None:
    drive_traffic(pagode_server, 3)
    declared, samples = scrape(pagode_server)
    assert any(n.startswith("pagode:") for n in samples), "the server exports no pagode: series"
    used: dict[str, str] = {}
    for target in dashboard_targets():
        names = metric_names(target["expr"])
        assert names, f"no metric in {target['expr']!r}"
        used.update({n: target["panel"] for n in names})
    missing = sorted(n for n in used if n not in samples)
    assert not missing, f"dashboard metrics absent from /metrics: {missing}"
    for name in used:
        family = histogram_family(name)
        if family is not None and name not in declared:
            assert declared.get(family) == "histogram", f"{name}: {family} is not a histogram"
        elif name.endswith("_total"):
            assert declared.get(name) == "counter", f"{name} is rated but is not a counter"
        else:
            assert declared.get(name) == "gauge", f"{name} is not a gauge"
        assert "model_name" in samples[name], f"{name} lacks the model_name label"


def test_dashboard_grouping_labels_exist_on_the_series(pagode_server: str) -> None:
    _, samples = scrape(pagode_server)
    added_by_prometheus = {"instance", "job"}
    for target in dashboard_targets():
        labels = grouping_labels(target["expr"]) - added_by_prometheus
        exported = set().union(*(samples[n] for n in metric_names(target["expr"])))
        assert labels <= exported, f"{target['panel']}: groups by {labels - exported}, not exported"


# --- the image's HEALTHCHECK --------------------------------------------------------


def healthcheck_command(port: int) -> list[str]:
    """The HEALTHCHECK's command, run here: the image's script is docker/healthcheck.py,
    given this server's URL (in the image it finds the port in pagode's command line)."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    match = re.search(r"^HEALTHCHECK .*?CMD (\[.*\])\s*$", text, re.M)
    assert match, "no exec-form HEALTHCHECK in the Dockerfile"
    argv: list[str] = json.loads(match.group(1))
    assert argv[:2] == ["python", "/usr/local/bin/pagode-healthcheck"]
    return [sys.executable, str(ROOT / "docker" / "healthcheck.py"), f"http://127.0.0.1:{port}{argv[2]}"]


def test_dockerfile_healthcheck_probes_a_real_server(pagode_server: str) -> None:
    port = int(pagode_server.rsplit(":", 1)[1])
    assert subprocess.run(healthcheck_command(port), timeout=30).returncode == 0
    dead = subprocess.run(healthcheck_command(free_port()), capture_output=True, timeout=30)
    assert dead.returncode == 1


# --- a real Prometheus evaluates every panel ----------------------------------------


def start_prometheus(target: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("prometheus")
    if exe is None:
        if os.geteuid() != 0:
            pytest.skip("prometheus is not installed and installing it needs root")
        pytest.fail("prometheus missing although we are root: run scripts/install-deploy-tools.sh")
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [{"job_name": "pagode", "static_configs": [{"targets": [target]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [exe, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    body = resp.json()
    assert body["status"] == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (httpx.HTTPError, ValueError):  # not up yet, or a non-JSON 503
            pass
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def test_every_panel_returns_data_from_a_real_prometheus(pagode_server: str, tmp_path: Path) -> None:
    proc, prometheus = start_prometheus(pagode_server.removeprefix("http://"), tmp_path)
    try:
        # Until it is ready, Prometheus answers queries with a plain-text 503.
        wait_for(lambda: httpx.get(f"{prometheus}/-/ready", timeout=2).status_code == 200,
                 60, "Prometheus to be ready")
        wait_for(lambda: query(prometheus, 'up{job="pagode"} == 1'), 60, "the first scrape")
        before = sum(float(r["value"][1]) for r in query(prometheus, "pagode:request_success_total"))
        drive_traffic(pagode_server, 4)
        # Rates need the increase inside the window: wait for a scrape that saw it.
        wait_for(lambda: sum(float(r["value"][1]) for r in query(
            prometheus, "pagode:request_success_total")) >= before + 4, 30, "the traffic's scrape")
        for target in dashboard_targets():
            expr = target["expr"].replace("$__rate_interval", "1m")
            result = query(prometheus, expr)
            assert result, f"{target['panel']}: {expr} returned no series"
            values = [float(r["value"][1]) for r in result]
            if "histogram_quantile" in expr:
                assert all(math.isfinite(v) and v > 0 for v in values), (expr, values)
    finally:
        stop(proc, grace=20)
