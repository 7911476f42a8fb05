"""pagode's image itself, built from the Dockerfile as a user builds it.

- It runs as an unprivileged user, and its root filesystem can be read-only: the only
  thing written at run time, the compiled C++ kernels, goes to the declared volume.
- It carries the C++ sources of every kernel (the wheel once lacked two, and `pagode
  serve` died at load inside the image) but no compiled kernel: they are compiled for
  the CPU the container runs on, at its first start (tests/test_docker_stack.py sees it).
- Its torch is the CPU build, and the image stays far from the size of a CUDA one.
- Its health check finds pagode's port in pagode's own command line.

The health-check unit tests run everywhere; the rest under `make test-docker`.
"""

from __future__ import annotations

import importlib.util
import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from docker_harness import (
    KERNEL_DIR,
    ROOT,
    built_images,
    image_size,
    in_image,
    kernel_sources,
    run,
    skip_unless_enabled,
)

MAX_IMAGE_BYTES = 3.0e9  # a CUDA torch alone would add several GB


def load_healthcheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pagode_healthcheck", ROOT / "docker" / "healthcheck.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def socket_port() -> Iterator[int]:
    """A port that is bound but not listening, for the duration of a with block."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def image_config(image: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(run(["docker", "image", "inspect", "-f", "{{json .Config}}",
                                             image]).stdout)
    return config


def test_healthcheck_takes_the_last_host_and_port_of_the_command_line() -> None:
    check = load_healthcheck()
    argv = ["/opt/venv/bin/python", "/opt/venv/bin/pagode", "serve", "--host", "0.0.0.0",
            "--port", "8000", "--kv-cache-memory", "1GiB", "--host", "127.0.0.1", "--port", "18123"]
    assert check.option(argv, "--port", "8000") == "18123"
    assert check.option(argv, "--host", "x") == "127.0.0.1"
    assert check.option(["pagode", "serve", "--port=9001"], "--port", "8000") == "9001"
    assert check.option(["pagode", "serve"], "--port", "8000") == "8000"


def test_healthcheck_fails_when_nothing_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    check = load_healthcheck()
    with socket_port() as port:  # bound, not listening: the connection is refused
        monkeypatch.setattr(check, "serve_argv", lambda: ["pagode", "serve", "--port", str(port)])
        monkeypatch.setattr("sys.argv", ["pagode-healthcheck", "/health"])
        assert check.health_url("/health") == f"http://127.0.0.1:{port}/health"
        assert check.main() == 1


@skip_unless_enabled
def test_image_runs_as_an_unprivileged_user() -> None:
    image = built_images().pagode
    config = image_config(image)
    assert config["User"] == "10001:10001"
    out = in_image(image, "id -u; id -g; touch /opt/venv/probe 2>&1 || echo refused")
    assert out.split()[:2] == ["10001", "10001"]
    assert "refused" in out, "the virtualenv must not be writable by the server's user"


@skip_unless_enabled
def test_root_filesystem_can_be_read_only_with_the_kernels_on_a_volume() -> None:
    """What a first start writes (kernels, races, prepacked weights) has a volume each, so a
    read-only container keeps it for the next one; nothing else is writable but /tmp."""
    image = built_images().pagode
    config = image_config(image)
    written = [KERNEL_DIR, "/opt/pagode-cache/races", "/opt/pagode-cache/prepacked"]
    assert set(written) <= set(config["Volumes"]), config["Volumes"]
    script = "; ".join(f"touch {d}/probe && echo {d}-writable" for d in written)
    script += ("; touch /tmp/probe && echo tmp-writable; touch /home/pagode/probe 2>/dev/null || echo home-read-only; "
               "touch /opt/pagode-cache/probe 2>/dev/null || echo cache-root-read-only")
    # --rm also removes the anonymous volumes that the VOLUME instruction gives the container.
    out = in_image(image, script, "--read-only", "--tmpfs", "/tmp")
    for word in (*(f"{d}-writable" for d in written), "tmp-writable", "home-read-only", "cache-root-read-only"):
        assert word in out, out


@skip_unless_enabled
def test_image_carries_every_kernel_source_and_no_compiled_kernel() -> None:
    image = built_images().pagode
    sources = kernel_sources()
    assert any(s.endswith(".cpp") for s in sources), "no C++ kernel sources found in the repository"
    site = in_image(image, "python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'").strip()
    script = "; ".join(f"test -f {site}/{s} || echo missing {s}" for s in sources)
    script += f"; echo kernels: $(ls -A {KERNEL_DIR} | wc -l)"
    out = in_image(image, script)
    assert "missing" not in out, f"the installed package lacks kernel sources:\n{out}"
    assert "kernels: 0" in out, f"the image must not ship kernels compiled on the build machine:\n{out}"
    tokenizers = in_image(image, "ls /opt/pagode-cache/tokenizers/*/tokenizer.json")
    assert "tokenizer.json" in tokenizers, "the tokenizer is built once, at build time"


@skip_unless_enabled
def test_image_has_the_cpu_torch_and_stays_small() -> None:
    image = built_images().pagode
    out = in_image(image, "python -c 'import torch; print(torch.__version__, torch.version.cuda)'; "
                          "pip list --format=freeze 2>/dev/null | grep -i -E '^(nvidia-|triton)' || true")
    version, cuda = out.split()[:2]
    assert cuda == "None" and "+cpu" in version, out
    assert "nvidia-" not in out.lower() and "triton" not in out.lower(), out
    assert image_size(image) < MAX_IMAGE_BYTES


@skip_unless_enabled
def test_image_declares_its_health_check_and_entrypoint() -> None:
    image = built_images().pagode
    config = image_config(image)
    assert config["Healthcheck"]["Test"] == ["CMD", "python", "/usr/local/bin/pagode-healthcheck", "/health"]
    assert config["Entrypoint"] == ["pagode", "serve", "--host", "0.0.0.0", "--port", "8000"]
    assert config["StopSignal"] == "SIGTERM"
    assert Path(in_image(image, "command -v g++").strip()).name == "g++"
