"""Replicas behind a real nginx running the shipped docker/nginx.conf.

Two `pagode serve` processes listen on loopback ports; nginx, with the template's
upstream addresses filled in, listens on a third. Through nginx:
- a stream arrives token by token (not buffered to the end) and intact: the same
  text, event for event, as the replica sends directly;
- loadgen's requests are spread over both replicas, as each replica's metrics show;
- after one replica is killed with SIGKILL in the middle of streams, only the streams
  it was running are lost: every request sent after the kill succeeds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from proxy_support import (
    ROOT,
    PinnedPair,
    Process,
    Stream,
    completion_body,
    later_modules_use,
    spawn,
    stream,
    success_count,
    wait_ok,
)

from loadgen.server_process import free_port

NGINX_TEMPLATE = ROOT / "docker" / "nginx.conf"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def require_nginx() -> str:
    path = shutil.which("nginx")
    if path:
        return path
    if os.geteuid() != 0:
        pytest.skip("nginx is not installed and installing it needs root: "
                    "run scripts/install-deploy-tools.sh as root")
    pytest.fail("nginx is missing although we are root: scripts/install-deploy-tools.sh "
                "(run by `make test`) should have installed it")


def render_nginx_conf(upstreams: list[str], listen: str) -> str:
    """What envsubst does in the nginx image: replace only the template's variables."""
    servers = " ".join(f"server {u} max_fails=1 fail_timeout=10s;" for u in upstreams)
    values = {"PAGODE_UPSTREAM_SERVERS": servers, "NGINX_LISTEN": listen}
    text = NGINX_TEMPLATE.read_text(encoding="utf-8")
    return re.sub(r"\$\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), text)


@dataclass
class Cluster:
    replicas: list[Process]
    nginx: Process
    model: str
    tmp: Path


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, pinned_pair: PinnedPair,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    nginx_exe = require_nginx()
    tmp = tmp_path_factory.mktemp("replicas")
    nginx: Process | None = None
    try:
        replicas = pinned_pair.ready()
        port = free_port()
        conf = tmp / "nginx.conf"
        conf.write_text(render_nginx_conf([r.url.removeprefix("http://") for r in replicas],
                                          f"127.0.0.1:{port}"), encoding="utf-8")
        nginx = spawn([nginx_exe, "-p", f"{tmp}/", "-c", str(conf), "-e", str(tmp / "error.log"),
                       "-g", f"daemon off; pid {tmp / 'nginx.pid'};"],
                      f"http://127.0.0.1:{port}", tmp / "nginx.log")
        wait_ok(nginx, "/nginx-health")
        model = httpx.get(f"{nginx.url}/v1/models", timeout=10).json()["data"][0]["id"]
        yield Cluster(replicas, nginx, model, tmp)
    finally:
        if nginx is not None:
            nginx.stop()
        if not later_modules_use(request, "pinned_pair"):
            pinned_pair.stop()


# --- streaming through the proxy ----------------------------------------------------


def test_streams_flow_token_by_token_and_intact_through_nginx(cluster: Cluster) -> None:
    body = completion_body(cluster.model, "The history of the printing press", 48)
    proxied = stream(cluster.nginx.url, body)
    assert proxied.ok, proxied.error
    usage = proxied.events[-1]["usage"]
    content_reads = proxied.content_reads
    assert len(content_reads) == usage["completion_tokens"] >= 32
    # Buffered to the end, the 48 events would come in a handful of reads; flowing,
    # each token's event comes in a read of its own (a few may share one).
    assert len(set(content_reads)) >= len(content_reads) // 2, content_reads
    direct = [Stream() for _ in cluster.replicas]
    threads = [threading.Thread(target=stream, args=(r.url, body, d))
               for r, d in zip(cluster.replicas, direct, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for reference in direct:
        assert reference.ok, reference.error
        assert proxied.text == reference.text
        assert len(reference.content_reads) == len(content_reads)


# --- load spread over both replicas -----------------------------------------------


def gauge(replica: Process, name: str) -> float:
    text = httpx.get(f"{replica.url}/metrics", timeout=10).text
    match = re.search(rf"^pagode:{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    assert match, f"{name} not in {replica.url}/metrics"
    return float(match.group(1))


def run_loadgen(url: str, out: Path, num_prompts: int, seed: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "loadgen.cli", "--url", url, "--rate", "8",
            "--num-prompts", str(num_prompts), "--input-len", "16:32", "--output-len", "16:32",
            "--seed", str(seed), "--out", str(out), "--no-progress", "--no-plots"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results: dict[str, Any] = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return results


def test_loadgen_through_nginx_reaches_both_replicas(cluster: Cluster) -> None:
    before = [success_count(r) for r in cluster.replicas]
    results = run_loadgen(cluster.nginx.url, cluster.tmp / "loadgen", 12, seed=1)
    summary = results["runs"][0]["summary"]
    assert (summary["completed"], summary["failed"]) == (12, 0)
    served = [success_count(r) - b for r, b in zip(cluster.replicas, before, strict=True)]
    assert all(n > 0 for n in served), f"requests served per replica: {served}"
    assert sum(served) >= 12


# --- a replica dies mid-run ---------------------------------------------------------


def test_killing_a_replica_loses_only_its_running_streams(cluster: Cluster) -> None:
    body = completion_body(cluster.model, "A long story about a lighthouse keeper", 64)
    streams = [Stream() for _ in range(4)]
    threads = [threading.Thread(target=stream, args=(cluster.nginx.url, body, s), daemon=True)
               for s in streams]
    for thread in threads:
        thread.start()
    for s in streams:
        assert s.first_content.wait(120), "a stream produced no token"
    victim, survivor = cluster.replicas
    running_on_victim = gauge(victim, "num_requests_running")
    assert running_on_victim >= 1, "least_conn should have given the victim some streams"
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(timeout=10)

    # Every request sent after the kill must succeed: nginx retries the refused
    # connection on the survivor and then takes the victim out of rotation.
    results = run_loadgen(cluster.nginx.url, cluster.tmp / "after_kill", 8, seed=2)
    summary = results["runs"][0]["summary"]
    errors = [r["error"] for r in results["runs"][0]["requests"] if not r["success"]]
    assert (summary["completed"], summary["failed"]) == (8, 0), errors

    for thread in threads:
        thread.join(timeout=180)
    lost = [s.error for s in streams if not s.ok]
    assert len(lost) <= running_on_victim, lost
    assert len(lost) >= 1, "the victim's streams cannot have survived a SIGKILL"
    assert gauge(survivor, "num_requests_running") == 0
