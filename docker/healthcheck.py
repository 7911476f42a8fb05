"""The image's HEALTHCHECK: GET a path (normally /health) of the `pagode serve` in this container.

Docker runs it inside the container, so it cannot be told the port by the command that
started the container: it reads it from pagode's own command line instead, the last
--host and --port winning as they do for argparse. That way `docker run IMAGE --port 9000`
or a compose file that moves the server to another port keeps a truthful health status.

    python /usr/local/bin/pagode-healthcheck /health     exit 0 on 200, else 1
    python docker/healthcheck.py http://127.0.0.1:8123/health   a full URL is used as given
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", "8000"
ANY_ADDRESS = {"0.0.0.0", "::", ""}


def serve_argv() -> list[str]:
    """The arguments of the `pagode serve` process (PID 1, or a child of an init)."""
    pids = sorted((p for p in Path("/proc").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    for pid in pids:
        try:
            argv = (pid / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        if "serve" in words and any(Path(w).name == "pagode" for w in words[: words.index("serve")]):
            return words
    return []


def option(argv: list[str], name: str, default: str) -> str:
    """The last value of --name (as `--name value` or `--name=value`)."""
    value = default
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(name + "="):
            value = word.split("=", 1)[1]
    return value


def health_url(path: str) -> str:
    argv = serve_argv()
    host = option(argv, "--host", DEFAULT_HOST)
    host = DEFAULT_HOST if host in ANY_ADDRESS else host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{option(argv, '--port', DEFAULT_PORT)}{path}"


def main() -> int:
    target = sys.argv[1] if len(sys.argv) > 1 else "/health"
    url = target if "://" in target else health_url(target)
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            return 0 if response.status == 200 else 1
    except Exception as err:  # an unhealthy server: any failure is a "no"
        print(f"unhealthy: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
