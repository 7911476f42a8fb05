"""cpu_kernels' ISA levels, cache key and per-level builds.

The level logic is checked on CPUs described by their flags; the builds are real: a
library compiled below AVX2 holds only the portable quantized linear, and agrees with
the AVX2 one.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from cpu_kernels import Level, Settings, build, isa, load
from engine import envs, native
from engine.quant import formats

XEON_FLAGS = ("fpu sse2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_vnni avx512_bf16 "
              "amx_tile amx_int8 amx_bf16")
CPUINFO = f"""processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Some Xeon
flags\t\t: {XEON_FLAGS}
processor\t: 1
model name\t: Some Xeon
flags\t\t: fpu
"""
AVX512 = frozenset(f for lvl in (Level.AVX2, Level.AVX512) for f in isa.REQUIRED_FLAGS[lvl])


def test_cpuinfo_gives_the_model_and_the_known_flags_of_the_first_cpu() -> None:
    model, flags = isa.parse_cpuinfo(CPUINFO)
    assert model == "Some Xeon"
    assert "amx_tile" in flags and "avx512_bf16" in flags and "fpu" not in flags


def test_each_level_needs_all_its_flags_and_amx_needs_permission() -> None:
    assert isa.CpuIsa("old", frozenset({"avx2", "fma"})).level is Level.BASELINE  # no F16C
    assert isa.CpuIsa("x", frozenset({"avx2", "fma", "f16c"})).level is Level.AVX2
    assert isa.CpuIsa("x", AVX512 - {"avx512_bf16"}).level is Level.AVX2
    assert isa.CpuIsa("x", AVX512).level is Level.AVX512
    with_amx = AVX512 | set(isa.REQUIRED_FLAGS[Level.AMX])
    assert isa.CpuIsa("x", with_amx, amx_permitted=False).level is Level.AVX512
    assert isa.CpuIsa("x", with_amx, amx_permitted=True).level is Level.AMX


def test_the_cap_lowers_the_level_and_never_raises_it() -> None:
    cpu = isa.CpuIsa("x", AVX512)
    assert isa.target_level(cpu, None) is Level.AVX512
    assert isa.target_level(cpu, Level.AVX2) is Level.AVX2
    assert isa.target_level(cpu, Level.AMX) is Level.AVX512


def test_pagode_cpu_isa_reaches_the_loader_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGODE_CPU_ISA", "AVX2")
    assert native.settings().isa_cap is Level.AVX2
    monkeypatch.setenv("PAGODE_CPU_ISA", "sse4")
    with pytest.raises(ValueError, match="PAGODE_CPU_ISA"):
        envs.CPU_ISA.get()


def test_the_cache_key_changes_with_level_and_compiler(tmp_path: Path) -> None:
    gcc12, gcc13 = build.Compiler("/usr/bin/g++", "12.2.0\nx86_64-linux-gnu"), build.Compiler("/usr/bin/g++", "13.1.0")
    avx2 = build.library_path(tmp_path, Level.AVX2, gcc12)
    assert avx2.name.startswith("pagode_cpu-avx2-") and avx2.suffix == ".so"
    assert build.library_path(tmp_path, Level.AVX512, gcc12).name.startswith("pagode_cpu-avx512-")
    assert build.cache_key(Level.AVX2, gcc12) != build.cache_key(Level.AVX2, gcc13)
    assert build.cache_key(Level.AVX2, gcc12) != build.cache_key(Level.BASELINE, gcc12)
    assert "-march=native" not in " ".join(build.flags(Level.AMX))


def test_a_per_level_variant_replaces_its_source_from_its_level_up(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("src/a.cpp", "src/b.cpp", "src/avx512/a.cpp", "src/amx/c.cpp"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    monkeypatch.setattr(build, "SOURCE_DIR", tmp_path / "src")

    def chosen(level: Level) -> list[str]:
        return [p.relative_to(tmp_path).as_posix() for p in build.sources(level)]

    assert chosen(Level.AVX2) == ["src/a.cpp", "src/b.cpp"]
    assert chosen(Level.AVX512) == ["src/avx512/a.cpp", "src/b.cpp"]
    assert chosen(Level.AMX) == ["src/avx512/a.cpp", "src/b.cpp", "src/amx/c.cpp"]


def test_a_baseline_build_holds_the_portable_linear_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Below AVX2 the library builds with no ISA flags: the AVX2 families are absent and the
    quantized linear runs its portable body, to the AVX2 body's numbers within rounding."""
    with caplog.at_level(logging.INFO, logger="pagode.cpu_kernels"):
        baseline = load(Settings(cache_dir=tmp_path, isa_cap=Level.BASELINE))
    assert baseline is not None and baseline.level is Level.BASELINE
    assert baseline.path.name.startswith("pagode_cpu-baseline-")
    assert "target level baseline, capped from" in caplog.text
    assert baseline.paged_attention is None and baseline.fused_ops is None and baseline.decode_step is None
    assert baseline.block_linear is not None and not baseline.block_linear.uses_avx2()
    best = native.block_linear()
    if best is None or not best.uses_avx2():
        pytest.skip("no AVX2 build to compare with on this CPU")
    torch.manual_seed(0)
    for kind in ("q4_1", "q8_0"):
        w = formats.quantize(torch.randn(70, 96) * 0.05, kind)  # type: ignore[arg-type]
        x = torch.randn(5, 96)
        torch.testing.assert_close(baseline.block_linear(x, w), best(x, w), rtol=1e-5, atol=1e-5)
