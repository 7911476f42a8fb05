"""Build small C++ libraries with the system compiler on first use, cached by content.

The CPU kernels are plain C functions loaded with ctypes, so they compile in about a
second with g++ and need no torch headers. A library is cached under
$PAGODE_CACHE_DIR/kernels (default ~/.cache/pagode) by a hash of its source and flags,
so an edit rebuilds it and concurrent builders never see half a file.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from engine import envs

log = logging.getLogger("pagode")

CPU_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]


def cache_path(source: Path, flags: list[str], depends: tuple[Path, ...] = ()) -> Path:
    """Where the library of `source` (and the files it #includes, `depends`) is cached."""
    content = b"".join(p.read_bytes() for p in (source, *depends))
    digest = hashlib.sha256(content + " ".join(flags).encode()).hexdigest()[:16]
    root = envs.CACHE_DIR.get()
    return root / "kernels" / f"{source.stem}-{digest}.so"


def build(source: Path, target: Path, flags: list[str]) -> None:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) found")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        subprocess.run([compiler, *flags, str(source), "-o", str(built)], check=True,
                       capture_output=True, text=True)
        built.replace(target)  # atomic: concurrent builders never see half a file


def load_library(source: Path, flags: list[str] | None = None,
                 depends: tuple[Path, ...] = ()) -> ctypes.CDLL | None:
    """The compiled library, or None (with a warning) when it cannot be built here."""
    flags = flags or CPU_FLAGS
    target = cache_path(source, flags, depends)
    try:
        if not target.exists():
            log.info("compiling %s into %s", source.name, target)
            build(source, target, flags)
        return ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or err
        log.warning("CPU kernel %s unavailable (%s); using the pure-torch path", source.name, detail)
        return None


def enabled() -> bool:
    """PAGODE_CPU_KERNEL=0 turns every C++ CPU kernel off (the pure-torch paths remain)."""
    return envs.CPU_KERNEL.get()


class Kernel:
    """One C++ library: built and loaded on first use, None where it cannot be.

    `declare` sets the ctypes signatures; `switch` is an extra switch (engine.envs) that
    turns this library off when false (PAGODE_CPU_KERNEL=0 turns every one off).
    """

    def __init__(self, source: Path, flags: list[str], declare: Callable[[ctypes.CDLL], None],
                 depends: tuple[Path, ...] = (), switch: envs.EnvVar[bool] | None = None) -> None:
        self.source, self.flags, self.depends = source, flags, depends
        self.declare, self.switch = declare, switch
        self.lib: ctypes.CDLL | None = None
        self.tried = False

    def load(self) -> ctypes.CDLL | None:
        if self.tried:
            return self.lib
        self.tried = True
        if not enabled() or (self.switch is not None and not self.switch.get()):
            return None
        lib = load_library(self.source, self.flags, self.depends)
        if lib is not None:
            self.declare(lib)
        self.lib = lib
        return lib
