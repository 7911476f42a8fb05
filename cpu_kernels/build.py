"""Compile the CPU kernels: the one place that owns the compiler flags, the target ISA's
flags, the sources that make the library and the key it is cached under.

One library is built from all of src/ for one target level (isa.py). One library, not one
per source: the fused decode step (src/decode_step.cpp) calls the very functions that the
per-op bindings call, so both paths run the same machine code and give the same numbers
by construction; the shared declarations sit in include/, with the hot helpers that must
inline (simd_exp.h) as `static inline`. It also means one build, one cache entry and
one dlopen per process. The price is that an edit to any source rebuilds all of them,
in a few seconds.

Flags: BASE_FLAGS for every build, plus the explicit flags of the target level, never
-march=native: a library in a shared cache (or in an image moved to another machine)
must not hold instructions that another CPU reading the same cache lacks.
-ffp-contract=off keeps the scalar arithmetic rounding as torch's does (no fused
multiply-adds), which the bit-for-bit tests rely on.

Per-level variants: a source `src/<level>/<name>.cpp` (e.g. src/avx512/quant_linear.cpp)
replaces `src/<name>.cpp` in the builds for that level and above, the highest such
variant winning; a variant may also be new (no file of that name in src/). Inside a
source, include/isa.h's macros (PAGODE_AVX2, PAGODE_AVX512, PAGODE_AMX) say what the
build may use.

The cache key covers everything that changes the binary: each compiled source and every
header (path and bytes), the flags, the compiler's path, version and target machine,
and the level, which is also in the file name (`pagode_cpu-avx2-<digest>.so`). A build
writes a temporary file and renames it, so concurrent builders never see half a file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cpu_kernels.isa import Level

ROOT = Path(__file__).parent
SOURCE_DIR = ROOT / "src"
INCLUDE_DIR = ROOT / "include"
LIBRARY_STEM = "pagode_cpu"

BASE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-ffp-contract=off")
_AVX2 = ("-mavx2", "-mfma", "-mf16c")
_AVX512 = (*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni",
           "-mavx512bf16")
ISA_FLAGS: dict[Level, tuple[str, ...]] = {
    Level.BASELINE: (),
    Level.AVX2: _AVX2,
    Level.AVX512: _AVX512,
    Level.AMX: (*_AVX512, "-mamx-tile", "-mamx-int8", "-mamx-bf16"),
}


@dataclass(frozen=True)
class Compiler:
    """A C++ compiler: its resolved path and what it says it is (version, target)."""

    path: str
    identity: str


def find_compiler(preferred: str | None = None) -> Compiler:
    """`preferred` (a name or path, e.g. $CXX) when given, else g++ or c++ from PATH."""
    candidates = [preferred] if preferred else ["g++", "c++"]
    found = next((p for p in map(shutil.which, candidates) if p), None)
    if found is None:
        raise RuntimeError(f"no C++ compiler found ({' or '.join(candidates)})")
    path = os.path.realpath(found)
    return Compiler(path, compiler_identity(path))


def compiler_identity(path: str) -> str:
    """GCC's full version and target machine; any other compiler's --version text."""
    for query in (["-dumpfullversion", "-dumpmachine"], ["--version"]):
        run = subprocess.run([path, *query], capture_output=True, text=True, check=False)
        if run.returncode == 0 and run.stdout.strip():
            return run.stdout.strip()
    raise RuntimeError(f"{path} does not say its version")


def flags(level: Level) -> list[str]:
    return [*BASE_FLAGS, *ISA_FLAGS[level]]


def sources(level: Level) -> list[Path]:
    """The .cpp files of a build for `level`: src/*.cpp, each replaced by its variant for the
    highest level <= `level` that has one."""
    chosen = {p.name: p for p in SOURCE_DIR.glob("*.cpp")}
    for variant_level in sorted(Level):
        if variant_level <= level:
            chosen.update({p.name: p for p in (SOURCE_DIR / variant_level.label).glob("*.cpp")})
    return [chosen[name] for name in sorted(chosen)]


def headers() -> list[Path]:
    return sorted(INCLUDE_DIR.rglob("*.h"))


def cache_key(level: Level, compiler: Compiler) -> str:
    digest = hashlib.sha256()
    for path in (*sources(level), *headers()):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    for part in (*flags(level), compiler.path, compiler.identity, level.label):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def library_path(cache_dir: Path, level: Level, compiler: Compiler) -> Path:
    """Where the library for `level`, built by `compiler`, is cached."""
    return cache_dir / f"{LIBRARY_STEM}-{level.label}-{cache_key(level, compiler)}.so"


def compile_library(target: Path, level: Level, compiler: Compiler) -> None:
    """Build the library into `target` atomically (a temporary file, then a rename).

    Each source compiles to its own object, as many at once as the machine has cores, then
    one link: a first start waits for the slowest source, not for the sum of them.
    Raises subprocess.CalledProcessError (with the compiler's stderr) when it fails."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        compiled = {source: Path(tmp) / f"{source.stem}.o" for source in sources(level)}
        compile_flags = [f for f in flags(level) if f != "-shared"]
        commands = [[compiler.path, *compile_flags, "-I", str(INCLUDE_DIR), "-c", str(source), "-o", str(obj)]
                    for source, obj in compiled.items()]
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            for run in pool.map(_run, commands):
                run.check_returncode()
        built = Path(tmp) / target.name
        _run([compiler.path, *flags(level), *map(str, compiled.values()), "-o", str(built)]).check_returncode()
        built.replace(target)


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=False, capture_output=True, text=True)
