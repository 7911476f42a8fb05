"""What the Docker tests share: the images, built once, and compose stacks on the loopback.

The images are built the way a user builds them (`docker build .`, BuildKit), with two
build arguments that this machine needs and the Dockerfile documents: the local Debian
base (scripts/docker-base-image.sh; no registry can be pulled from here) and the torch
wheel that lies on this machine's disk. Prometheus and nginx come from Debian's packages,
in images built from docker/local/ on the same base; the router image
(docker/router.Dockerfile) is built on that base too.

A stack is a shipped compose file, resolved by `docker-compose config` and then changed
only where this machine forces it (`on_loopback`): every service on the host's network,
listening on 127.0.0.1 at a free port (so no traffic leaves the loopback and nothing
collides with another server here), the locally built images, a 2 s health-check
interval (the image's own check, run more often, so that "healthy" is timed closely),
and Grafana, which has no package here, left out with its profile. Replicas cannot share
a port on the host's network, so the scaled `pagode` service becomes one service per
replica, each an exact copy but for its port, and nginx's upstream list and the router's
worker URLs name them (nginx, behind a profile in the shipped file, runs beside the router).

The tests run under `make test-docker` (scripts/test-docker.sh sets DOCKER_TESTS=1 and
brings up dockerd); under a plain `make test` they skip, saying so.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from proxy_support import router_args

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
COMPOSE_REPLICAS = DOCKER / "compose.replicas.yaml"
PROMETHEUS_YML = DOCKER / "prometheus.yml"
LOCAL_IMAGES = DOCKER / "local"

IMAGE = "pagode:cpu"
PROMETHEUS_IMAGE = "pagode-prometheus:local"
NGINX_IMAGE = "pagode-nginx:local"
ROUTER_IMAGE = "pagode-router:test"
BASE_IMAGE = os.environ.get("DOCKER_BASE_IMAGE", "pagode-base:bookworm")
PROJECT = "pagode-docker-test"
KERNEL_VOLUME = f"{PROJECT}_pagode-kernels"
KERNEL_DIR = "/opt/pagode-cache/kernels"
TORCH_WHEELS = "/opt/wheels/torch-*+cpu-cp311-cp311-*.whl"
HOST_CERTS = Path("/usr/local/share/ca-certificates")
HEALTH_INTERVAL = "2s"
PINNED_FUSED_DECODE_LIMIT = 16  # what the single stack's start measured here
PINNED_QUANT_CROSSOVER = 8
PINNED_QUANT_TILES = 8
# A cold start on a busy 2-core machine: loading, compiling the C++ kernels,
# measuring the kernels' crossovers. Minutes when other jobs share the cores.
STARTUP_TIMEOUT_S = 900.0

ENABLED = os.environ.get("DOCKER_TESTS") == "1"
skip_unless_enabled = pytest.mark.skipif(
    not ENABLED, reason="the Docker tests run under `make test-docker` (DOCKER_TESTS=1)")


# --- commands ---------------------------------------------------------------------


def run(argv: Sequence[str | Path], *, timeout: float = 600, check: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command; with `check`, a failure fails the test with its output."""
    args = [str(a) for a in argv]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "COMPOSE_INTERACTIVE_NO_CLI": "1", **(env or {})})
    if check and result.returncode != 0:
        pytest.fail(f"`{' '.join(args)}` exited with {result.returncode}:\n"
                    f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def require_docker() -> None:
    """The engine must answer: make test-docker started it, and a missing one is a failure."""
    result = run(["docker", "info", "--format", "{{.ServerVersion}}"], check=False, timeout=60)
    if result.returncode != 0:
        pytest.fail("no Docker engine answers (run the tests with `make test-docker`, which "
                    f"starts dockerd):\n{result.stderr[-2000:]}")


@functools.cache
def compose_cli() -> tuple[str, ...]:
    """`docker compose` (v2) where the plugin exists, else docker-compose (v1)."""
    if run(["docker", "compose", "version"], check=False).returncode == 0:
        return ("docker", "compose")
    if shutil.which("docker-compose"):
        return ("docker-compose",)
    pytest.fail("neither `docker compose` nor docker-compose is installed "
                "(scripts/install-deploy-tools.sh installs Debian's docker-compose)")


@functools.cache
def buildkit_client() -> tuple[str, ...]:
    """A docker client that builds with BuildKit.

    The Dockerfile needs BuildKit (the legacy builder builds every stage, the CUDA base
    included). Docker 23+ uses it through the buildx plugin; an older client (Debian's
    20.10) uses the daemon's own with DOCKER_BUILDKIT=1; a newer client without buildx
    has no BuildKit at all.
    """
    if run(["docker", "buildx", "version"], check=False).returncode == 0:
        return ("docker",)
    for client in dict.fromkeys([shutil.which("docker"), "/usr/bin/docker"]):
        if not client or not Path(client).exists():
            continue
        version = run([client, "version", "--format", "{{.Client.Version}}"], check=False)
        major = version.stdout.strip().split(".")[0]
        if major.isdigit() and int(major) < 23:
            return (client,)
    pytest.fail("no docker client with BuildKit: install the buildx plugin (docker-buildx) "
                "or Debian's docker.io client")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def record(name: str, value: float | str, unit: str = "") -> None:
    """A measurement for docs/docker.md: printed, and kept by make test-docker's report."""
    line = json.dumps({"name": name, "value": round(value, 1) if isinstance(value, float) else value,
                       "unit": unit})
    print(line)
    report = os.environ.get("DOCKER_TEST_REPORT")
    if report:
        with open(report, "a", encoding="utf-8") as out:
            out.write(line + "\n")


# --- images -----------------------------------------------------------------------


@dataclass(frozen=True)
class Images:
    pagode: str
    prometheus: str
    nginx: str
    router: str


def stage_build_inputs() -> dict[str, str]:
    """Put the local torch wheel and the host's extra CAs into the build context.

    Returns the build arguments that name them. Without a local wheel the image fetches
    torch from the Dockerfile's CPU index, as it does elsewhere.
    """
    args = {"PYTHON_IMAGE": BASE_IMAGE}
    for cert in sorted(HOST_CERTS.glob("*.crt")):
        shutil.copyfile(cert, DOCKER / "certs" / cert.name)
    wheels = sorted(Path("/").glob(TORCH_WHEELS.lstrip("/")))
    if wheels:
        wheel = wheels[-1]
        staged = DOCKER / "wheels" / wheel.name
        if not staged.exists() or staged.stat().st_size != wheel.stat().st_size:
            staged.unlink(missing_ok=True)
            try:
                os.link(wheel, staged)
            except OSError:
                shutil.copyfile(wheel, staged)
        args["TORCH_WHEEL"] = wheel.name
    return args


def build(tag: str, dockerfile: Path, context: Path, args: dict[str, str]) -> float:
    """docker build with BuildKit on the host's network; the seconds it took."""
    argv = [*buildkit_client(), "build", "--network", "host", "--progress", "plain",
            "-f", str(dockerfile), "-t", tag]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    start = time.monotonic()
    run([*argv, str(context)], timeout=1800, env={"DOCKER_BUILDKIT": "1"})
    return time.monotonic() - start


def image_size(tag: str) -> int:
    return int(run(["docker", "image", "inspect", "-f", "{{.Size}}", tag]).stdout.strip())


@functools.cache
def built_images() -> Images:
    """Build (or, from the build cache, refresh) every image once per test session."""
    require_docker()
    result = run(["bash", ROOT / "scripts" / "docker-base-image.sh", BASE_IMAGE], timeout=900)
    built = re.search(r"built \S+ in (\d+) s", result.stdout)
    if built:
        record("base image build (debootstrap + import)", float(built.group(1)), "s")
    base = {"BASE_IMAGE": BASE_IMAGE}
    pagode_args = stage_build_inputs()  # the CAs too, which the router's builder trusts
    # Prometheus, nginx and the router are small and mostly download: built beside pagode's image.
    with ThreadPoolExecutor(max_workers=2) as pool:
        sidecars = pool.submit(lambda: [
            build(PROMETHEUS_IMAGE, LOCAL_IMAGES / "prometheus.Dockerfile", LOCAL_IMAGES, base),
            build(NGINX_IMAGE, LOCAL_IMAGES / "nginx.Dockerfile", LOCAL_IMAGES, base),
            build(ROUTER_IMAGE, DOCKER / "router.Dockerfile", DOCKER, {"PYTHON_IMAGE": BASE_IMAGE})])
        seconds = build(IMAGE, ROOT / "Dockerfile", ROOT, pagode_args)
        sidecars.result()
    record("pagode image build (this run; cached layers count as done)", seconds, "s")
    record("pagode image size", image_size(IMAGE) / 1e9, "GB")
    record("router image size", image_size(ROUTER_IMAGE) / 1e9, "GB")
    return Images(IMAGE, PROMETHEUS_IMAGE, NGINX_IMAGE, ROUTER_IMAGE)


def in_image(image: str, script: str, *docker_args: str, check: bool = True) -> str:
    """Run a shell script in a throw-away container of `image`; its output."""
    result = run(["docker", "run", "--rm", "--network", "none", *docker_args,
                  "--entrypoint", "sh", image, "-c", script], check=check, timeout=120)
    return result.stdout + result.stderr


def kernel_sources() -> list[str]:
    """The C++ kernel sources in the repository's Python packages (tests and benchmarks aside)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks"}
    return [f for f in tracked if f.endswith((".cpp", ".h")) and f.split("/")[0] in packages]


def volume_holds_kernels(image: str) -> bool:
    """Whether the test stacks' kernel volume already holds compiled libraries."""
    if run(["docker", "volume", "inspect", KERNEL_VOLUME], check=False).returncode != 0:
        return False
    listing = in_image(image, f"find {KERNEL_DIR} -name '*.so'", "-v", f"{KERNEL_VOLUME}:{KERNEL_DIR}")
    return ".so" in listing


# --- stacks -----------------------------------------------------------------------


def resolved_config(compose_file: Path) -> dict[str, Any]:
    """The compose file as compose reads it: variables, extends and paths resolved."""
    config: dict[str, Any] = yaml.safe_load(run([*compose_cli(), "-f", compose_file, "config"]).stdout)
    return config


def on_loopback(service: dict[str, Any]) -> dict[str, Any]:
    """The service on the host's network: published ports and compose networks go."""
    kept = {k: v for k, v in service.items()
            if k not in ("ports", "expose", "networks", "build", "deploy", "profiles")}
    return {**kept, "network_mode": "host"}


def pagode_service(service: dict[str, Any], image: str, port: int,
                   pinned: bool = False) -> dict[str, Any]:
    """The shipped pagode service, listening on 127.0.0.1:port (the last --host/--port win).

    `pinned` fixes the kernel crossovers that a start otherwise measures (the
    operator's knobs for reproducible runs): replicas that start together on the same
    cores would time each other's measurements, for minutes on a busy machine.
    """
    command = [*service.get("command", []), "--host", "127.0.0.1", "--port", str(port)]
    env = dict(service.get("environment") or {})
    if pinned:
        command += ["--fused-decode-limit", str(PINNED_FUSED_DECODE_LIMIT)]
        env["PAGODE_QUANT_CROSSOVER"] = str(PINNED_QUANT_CROSSOVER)
        env["PAGODE_QUANT_TILES"] = str(PINNED_QUANT_TILES)
    return {**on_loopback(service), "image": image, "command": command,
            **({"environment": env} if env else {}),
            # Only the interval: the check itself stays the image's HEALTHCHECK.
            "healthcheck": {"interval": HEALTH_INTERVAL}}


def mount_target(volume: str | dict[str, Any]) -> str:
    return volume["target"] if isinstance(volume, dict) else volume.split(":")[1]


def prometheus_service(service: dict[str, Any], image: str, config: Path, port: int) -> dict[str, Any]:
    target = "/etc/prometheus/prometheus.yml"
    volumes = [v for v in service.get("volumes", []) if mount_target(v) != target]
    return {**on_loopback(service), "image": image,
            "volumes": [*volumes, f"{config}:{target}:ro"],
            "command": [*service.get("command", []), f"--web.listen-address=127.0.0.1:{port}"]}


def prometheus_config(pagode_ports: Sequence[int], own_port: int) -> str:
    """docker/prometheus.yml with static loopback targets: DNS discovery of the service
    name needs compose's network, which the host's network does not have."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text(encoding="utf-8"))
    for job in config["scrape_configs"]:
        if job["job_name"] == "pagode":
            job.pop("dns_sd_configs")
            job["static_configs"] = [{"targets": [f"127.0.0.1:{p}" for p in pagode_ports]}]
        elif job["job_name"] == "prometheus":
            job["static_configs"] = [{"targets": [f"127.0.0.1:{own_port}"]}]
    text: str = yaml.safe_dump(config, sort_keys=False)
    return text


def nginx_service(service: dict[str, Any], image: str, port: int,
                  replicas: dict[str, int]) -> dict[str, Any]:
    """The shipped nginx service, its one upstream line repeated once per replica."""
    env = dict(service["environment"])
    line = env["PAGODE_UPSTREAM_SERVERS"]
    assert "pagode:8000" in line, line
    env["PAGODE_UPSTREAM_SERVERS"] = " ".join(line.replace("pagode:8000", f"127.0.0.1:{p}")
                                              for p in replicas.values())
    env["NGINX_LISTEN"] = f"127.0.0.1:{port}"
    return {**on_loopback(service), "image": image, "environment": env,
            "depends_on": {name: {"condition": "service_healthy"} for name in replicas}}


def router_service(service: dict[str, Any], image: str, port: int, metrics_port: int,
                   replicas: dict[str, int]) -> dict[str, Any]:
    """The shipped router service, its one worker URL (the scaled service's name, which the
    entry point expands by DNS) replaced by one loopback URL per replica."""
    command = [str(a) for a in service["command"]]
    assert "http://pagode:8000" in command, command
    workers = [f"http://127.0.0.1:{p}" for p in replicas.values()]
    return {**on_loopback(service), "image": image,
            "command": router_args(command, port, metrics_port, workers),
            "depends_on": {name: {"condition": "service_healthy"} for name in replicas}}


def parse_time(stamp: str) -> float:
    """A Docker timestamp (nanoseconds, Z) as epoch seconds."""
    whole, _, rest = stamp.rstrip("Z").partition(".")
    fraction = float("0." + re.sub(r"\D", "", rest)) if rest else 0.0
    return datetime.fromisoformat(whole + "+00:00").timestamp() + fraction


@dataclass
class Stack:
    """One compose project on the loopback, from a generated compose file."""

    file: Path
    ports: dict[str, int]
    project: str = PROJECT

    def compose(self, *args: str, timeout: float = 600,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        return run([*compose_cli(), "-p", self.project, "-f", self.file, *args],
                   timeout=timeout, check=check)

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    def up(self) -> None:
        self.compose("up", "-d", "--no-build", timeout=STARTUP_TIMEOUT_S + 120)

    def down(self, *args: str) -> None:
        self.compose("down", "--remove-orphans", "--timeout", "45", *args, timeout=300)

    def container(self, service: str) -> str:
        ids = self.compose("ps", "-q", service).stdout.split()
        assert len(ids) == 1, f"{service}: containers {ids}"
        return ids[0]

    def inspect(self, service: str) -> dict[str, Any]:
        out = run(["docker", "inspect", self.container(service)]).stdout
        info: dict[str, Any] = json.loads(out)[0]
        return info

    def logs(self, service: str) -> str:
        result = run(["docker", "logs", self.container(service)], check=False)
        return result.stdout + result.stderr

    def running(self) -> list[str]:
        """Every container of this project, running or not."""
        out = run(["docker", "ps", "-a", "-q", "--filter",
                   f"label=com.docker.compose.project={self.project}"]).stdout
        return out.split()

    def wait_healthy(self, service: str, timeout: float = STARTUP_TIMEOUT_S) -> float:
        """Wait for the container's own health check; seconds from its start to healthy."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.inspect(service)["State"]
            health = state.get("Health") or {}
            if health.get("Status") == "healthy":
                # The health log outlives a restart: only checks of this start count.
                started = parse_time(state["StartedAt"])
                passed = [e for e in health.get("Log", [])
                          if e.get("ExitCode") == 0 and parse_time(e["Start"]) >= started]
                if passed:
                    return parse_time(passed[0]["End"]) - started
            if state["Status"] in ("exited", "dead"):
                pytest.fail(f"{service} exited with {state['ExitCode']}:\n{self.logs(service)[-6000:]}")
            time.sleep(0.5)
        pytest.fail(f"{service} not healthy after {timeout:.0f} s:\n{self.logs(service)[-6000:]}")


def write_stack(tmp: Path, config: dict[str, Any], ports: dict[str, int]) -> Stack:
    path = tmp / "compose.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return Stack(path, ports)


def single_stack(tmp: Path, images: Images) -> Stack:
    """docker/compose.yaml (pagode and Prometheus) on the loopback."""
    shipped = resolved_config(COMPOSE)
    services = shipped["services"]
    ports = {"pagode": free_port(), "prometheus": free_port()}
    prom_config = tmp / "prometheus.yml"
    prom_config.write_text(prometheus_config([ports["pagode"]], ports["prometheus"]), encoding="utf-8")
    prom_config.chmod(0o644)
    config = {**shipped, "services": {
        "pagode": pagode_service(services["pagode"], images.pagode, ports["pagode"]),
        "prometheus": prometheus_service(services["prometheus"], images.prometheus,
                                         prom_config, ports["prometheus"]),
    }}
    started = {name for name, svc in services.items() if not svc.get("profiles")}
    assert started == {"pagode", "prometheus"}, "only Grafana and loadgen sit behind a profile"
    return write_stack(tmp, config, ports)


def replicas_stack(tmp: Path, images: Images, replicas: int = 2) -> Stack:
    """docker/compose.replicas.yaml (the router and nginx before N replicas, Prometheus) on
    the loopback; nginx, behind a profile there, runs too."""
    shipped = resolved_config(COMPOSE_REPLICAS)
    services = shipped["services"]
    assert services["pagode"]["deploy"]["replicas"] == replicas
    names = {f"pagode-{i + 1}": free_port() for i in range(replicas)}
    ports = {**names, "router": free_port(), "router-metrics": free_port(), "nginx": free_port(),
             "prometheus": free_port()}
    prom_config = tmp / "prometheus.yml"
    prom_config.write_text(prometheus_config(list(names.values()), ports["prometheus"]), encoding="utf-8")
    prom_config.chmod(0o644)
    config = {**shipped, "services": {
        **{name: pagode_service(services["pagode"], images.pagode, port, pinned=True)
           for name, port in names.items()},
        "router": router_service(services["router"], images.router, ports["router"],
                                 ports["router-metrics"], names),
        "nginx": nginx_service(services["nginx"], images.nginx, ports["nginx"], names),
        "prometheus": prometheus_service(services["prometheus"], images.prometheus,
                                         prom_config, ports["prometheus"]),
    }}
    return write_stack(tmp, config, ports)


def model_name(url: str) -> str:
    name: str = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    return name
