"""A real two-node Ray cluster on this machine, for the Ray Serve tests: `ray start --head`,
then `ray start --address` for a second node, each with its own ports and one CPU.

`ray stop` would end every Ray process of the user, other jobs' too; this cluster's processes
are found instead by a marker in their environment (Ray's daemons and workers inherit it)
and only they are stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from loadgen.server_process import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
MARKER = "PAGODE_TEST_RAY_CLUSTER"
START_TIMEOUT_S = 180.0


@dataclass
class RayCluster:
    address: str
    temp_dir: Path
    marker: str

    def pids(self) -> list[int]:
        return marked_pids(f"{MARKER}={self.marker}".encode())


def node_ports() -> list[str]:
    """A node's own ports: two nodes on one host must not share the defaults."""
    return ["--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
            "--runtime-env-agent-port", str(free_port()), "--metrics-export-port", str(free_port())]


def ray_start(args: list[str], env: dict[str, str], log: Path) -> None:
    with open(log, "ab") as out:
        subprocess.run([RAY, "start", "--disable-usage-stats", "--num-cpus", "1", "--node-ip-address", "127.0.0.1",
                        "--object-store-memory", str(200 * 1024 * 1024), *node_ports(), *args],
                       env=env, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=START_TIMEOUT_S)


@contextlib.contextmanager
def two_node_cluster(log_dir: Path) -> Iterator[RayCluster]:
    # Unix socket paths must stay short: the temp dir is a short one under /tmp.
    temp_dir = Path(tempfile.mkdtemp(prefix="pgray-", dir="/tmp"))
    marker = uuid.uuid4().hex
    env = {**os.environ, MARKER: marker, "RAY_USAGE_STATS_ENABLED": "0",
           # the workers import this checkout's pagode, not an installed copy
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    port = free_port()
    cluster = RayCluster(f"127.0.0.1:{port}", temp_dir, marker)
    log = log_dir / "ray-start.log"
    try:
        ray_start(["--head", "--port", str(port), "--include-dashboard", "false", "--temp-dir", str(temp_dir),
                   "--ray-client-server-port", str(free_port())], env, log)
        ray_start(["--address", cluster.address], env, log)
        yield cluster
    finally:
        stop_marked(cluster)
        # Serve's logs (controller, proxy, replicas) outlive the cluster, with the test's logs.
        subprocess.run(["cp", "-r", str(temp_dir / "session_latest" / "logs" / "serve"), str(log_dir)], check=False)
        subprocess.run(["rm", "-rf", str(temp_dir)], check=False)


def marked_pids(entry: bytes) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if entry in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
    return found


def stop_marked(cluster: RayCluster, grace_s: float = 2.0) -> None:
    """SIGTERM this cluster's processes, then SIGKILL what is left after `grace_s`. Ray's GCS
    server and raylets outlive a SIGTERM by more than 8 s (after ray.shutdown, with no job
    left), so a longer grace is only waited through; the cluster's state is thrown away."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = cluster.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            time.sleep(0.2)
            pids = cluster.pids()
        if not pids:
            return
