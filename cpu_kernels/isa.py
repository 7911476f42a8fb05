"""What this CPU can run, detected at run time, and the instruction-set level to build for.

A compiled library may only hold instructions that every CPU reading the same cache has,
so the kernels are never built with -march=native: build.py compiles for one of a few
named levels, each with explicit flags, and this module picks the highest level that
this CPU lists in /proc/cpuinfo (and, for AMX, that the kernel grants the process):

    baseline  no ISA flags (any x86-64, or another architecture)
    avx2      AVX2, FMA, F16C
    avx512    avx2 + AVX-512 F/BW/VL/DQ, AVX512-VNNI and AVX512-BF16 (all of them)
    amx       avx512 + AMX-TILE/INT8/BF16, listed by the CPU and permitted by the OS

A cap (PAGODE_CPU_ISA, read on the engine side) lowers the level, never raises it.
Outside Linux on x86 the flags are unknown and the level is baseline.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path


class Level(IntEnum):
    """A target instruction set; each level includes the ones below it."""

    BASELINE = 0
    AVX2 = 1
    AVX512 = 2
    AMX = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Level:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown CPU ISA level {text!r}; "
                             f"choose one of {', '.join(lvl.label for lvl in cls)}") from None


# The /proc/cpuinfo flags each level needs on top of the level below it.
REQUIRED_FLAGS: dict[Level, tuple[str, ...]] = {
    Level.AVX2: ("avx2", "fma", "f16c"),
    Level.AVX512: ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"),
    Level.AMX: ("amx_tile", "amx_int8", "amx_bf16"),
}
_KNOWN_FLAGS = frozenset(f for flags in REQUIRED_FLAGS.values() for f in flags)

# arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux hands out AMX tile state only
# to a process that asks for it, and may refuse (an old kernel, a sandbox).
_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


@dataclass(frozen=True)
class CpuIsa:
    """The CPU's model name, the ISA flags it lists that matter here, and AMX permission."""

    model: str
    flags: frozenset[str]
    amx_permitted: bool = False

    @property
    def level(self) -> Level:
        """The highest level whose flags the CPU lists (and, for AMX, the OS permits)."""
        best = Level.BASELINE
        for level in (Level.AVX2, Level.AVX512, Level.AMX):
            if not self.flags.issuperset(REQUIRED_FLAGS[level]):
                break
            if level is Level.AMX and not self.amx_permitted:
                break
            best = level
        return best

    def describe(self) -> str:
        listed = " ".join(sorted(self.flags)) or "none of the known ones"
        amx = "" if "amx_tile" not in self.flags else (
            ", AMX permitted" if self.amx_permitted else ", AMX listed but not permitted by the OS")
        return f"{self.model or 'unknown CPU'} (flags: {listed}{amx})"


def target_level(cpu: CpuIsa, cap: Level | None) -> Level:
    """The level to build for: the CPU's own, lowered to `cap` when one is given."""
    return cpu.level if cap is None else min(cpu.level, cap)


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """(model name, the known ISA flags) from the text of /proc/cpuinfo (its first CPU)."""
    model, flags = "", frozenset[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split()) & _KNOWN_FLAGS
        if model and flags:
            break
    return model, flags


@functools.cache
def detect() -> CpuIsa:
    """This machine's CPU, read once per process."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return CpuIsa(platform.processor() or platform.machine(), frozenset())
    try:
        model, flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return CpuIsa("", frozenset())
    permitted = flags.issuperset(REQUIRED_FLAGS[Level.AMX]) and request_amx_permission()
    return CpuIsa(model, flags, permitted)


def request_amx_permission() -> bool:
    """Ask Linux for the AMX tile-data state; True when granted (already or now)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        status = libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_REQ_XCOMP_PERM),
                              ctypes.c_long(_XFEATURE_XTILEDATA))
    except (OSError, AttributeError):
        return False
    return int(status) == 0
