"""Prepacked weights (engine/model/prepack.py) on real `pagode serve` processes: the first
start packs the quantized model and saves it, a second start with the same cache reads the
pack back and answers with the same greedy tokens and logprobs, and a truncated pack is
packed again while the server still serves. What a pack's key holds is checked in process."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch
from server_fixtures import SMALL_ARGS, ServerProcess, running_server
from tests_support import cache_sharing_builds

from engine.model import prepack
from engine.runner.model_runner import LOWEST_PRIORITY, ModelRunner
from engine.tuning import race_memory

# The default --quantization auto (int4 on a CPU with the kernels), with a pinned fused-decode
# limit: its race is no part of what is packed, and it is most of a start on a busy machine.
ARGS = [*SMALL_ARGS, "--fused-decode-limit", "8", "--max-num-seqs", "8"]
READ = re.compile(r"weights: read prepacked from (\S+) in")
SAVED = re.compile(r"weights: packed in [\d.]+ s, saved to (\S+) in")


@pytest.fixture
def cache(tmp_path: Path) -> dict[str, str]:
    """A cache of this test's own (no pack in it), with the run's builds and races linked in."""
    run_cache = Path(os.environ["PAGODE_CACHE_DIR"])
    (run_cache / "races").mkdir(parents=True, exist_ok=True)
    own = cache_sharing_builds(tmp_path / "cache", run_cache)
    (own / "races").symlink_to((run_cache / "races").resolve(), target_is_directory=True)
    # the pack is small; the default margin of free disk is for real models' packs, and a
    # machine's free space is no part of what these starts test
    return {"PAGODE_CACHE_DIR": str(own), "PAGODE_PACK_KEEP_FREE_GIB": "0"}


def greedy(server: ServerProcess) -> tuple[list[str], list[float]]:
    body = httpx.post(f"{server.api_url}/completions", timeout=120, json={
        "model": "SmolLM2-135M-Instruct", "prompt": "The capital of France is", "max_tokens": 12,
        "temperature": 0, "logprobs": 2, "ignore_eos": True}).json()
    lp: dict[str, Any] = body["choices"][0]["logprobs"]
    return lp["tokens"], lp["token_logprobs"]


def layer_races(server: ServerProcess) -> set[tuple[str, str, str]]:
    """The layers' kernel races (race, shape, choice) that /metrics lists."""
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    rows = [dict(re.findall(r'(\w+)="([^"]*)"', line)) for line in text.splitlines()
            if line.startswith("pagode:load_race_info{")]
    return {(r["race"], r["key"], r["choice"]) for r in rows if r["race"] in prepack.LAYER_RACES}


@pytest.mark.slow
def test_a_second_start_reads_the_pack_and_a_broken_pack_is_packed_again(tmp_path: Path,
                                                                          cache: dict[str, str]) -> None:
    with running_server(ARGS, tmp_path, env=cache, name="first") as first:
        packed = greedy(first)
        chosen = layer_races(first)
    log = first.log()  # after the stop, which waits for the pack's writer
    assert not READ.search(log), log[-3000:]
    saved = SAVED.search(log)
    assert saved, log[-3000:]
    path = Path(saved.group(1))
    assert path.exists() and path.parent == Path(cache["PAGODE_CACHE_DIR"]) / "prepacked"

    with running_server(ARGS, tmp_path, env=cache, name="second") as second:
        assert greedy(second) == packed  # the same weights: the same tokens and logprobs
        assert chosen and layer_races(second) == chosen  # the pack says what its layers' races chose
    log = second.log()  # after the stop, which waits for the pack's writer
    read = READ.search(log)
    assert read and Path(read.group(1)) == path, log[-3000:]
    assert "loading weights" not in log and not SAVED.search(log)

    size = path.stat().st_size
    with open(path, "r+b") as f:  # a start killed mid-write would leave no such file; a full disk might
        f.truncate(size // 2)
    with running_server(ARGS, tmp_path, env=cache, name="truncated") as third:
        assert greedy(third) == packed
    log = third.log()  # after the stop, which waits for the pack's writer
    assert f"the prepacked file {path} is unusable" in log, log[-3000:]
    saved = SAVED.search(log)
    assert saved and Path(saved.group(1)) == path and path.stat().st_size == size
    assert not list(path.parent.glob("*.tmp"))  # the temporary file was renamed into place


def with_the_runs_kernels(root: Path) -> str:
    """A cache at `root` holding the run's compiled kernels: a key names the kernel library,
    which an empty cache would compile first."""
    return str(cache_sharing_builds(root, Path(os.environ["PAGODE_CACHE_DIR"])))


def test_a_pack_key_changes_with_what_the_weights_depend_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = with_the_runs_kernels(tmp_path)
    monkeypatch.setenv("PAGODE_CACHE_DIR", cache)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    cpu, fp32 = torch.device("cpu"), torch.float32
    base = prepack.path_for(prepack.pack_key(model, "int4", fp32, cpu, 512))
    assert base == prepack.path_for(prepack.pack_key(model, "int4", fp32, cpu, 512))  # stable
    assert base.parent == tmp_path / "prepacked"
    others = [prepack.pack_key(model, "int8", fp32, cpu, 512), prepack.pack_key(model, "int4", fp32, cpu, 64)]
    monkeypatch.setenv("PAGODE_QUANT_CROSSOVER", "4")
    others.append(prepack.pack_key(model, "int4", fp32, cpu, 512))
    monkeypatch.delenv("PAGODE_QUANT_CROSSOVER")
    here = race_memory.machine()
    monkeypatch.setattr(race_memory, "machine", lambda: {**here, "threads": here["threads"] + 1})
    others.append(prepack.pack_key(model, "int4", fp32, cpu, 512))
    monkeypatch.undo()
    monkeypatch.setenv("PAGODE_CACHE_DIR", cache)
    os.utime(model, ns=(1, 1))  # the same path, another file
    others.append(prepack.pack_key(model, "int4", fp32, cpu, 512))
    paths = {prepack.path_for(key) for key in others}
    assert base not in paths and len(paths) == len(others)


def test_warmup_and_the_switch_neither_read_nor_write_packs(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, fp32 = torch.device("cpu"), torch.float32
    monkeypatch.setattr(race_memory, "_fresh", False)
    monkeypatch.delenv("PAGODE_RACE_CACHE", raising=False)
    assert prepack.applies("int4", fp32, cpu)
    assert not prepack.applies("none", fp32, cpu) and not prepack.applies("int4", torch.bfloat16, cpu)
    race_memory.race_again(True)
    try:
        assert not prepack.applies("int4", fp32, cpu)
    finally:
        race_memory.race_again(False)
    monkeypatch.setenv("PAGODE_RACE_CACHE", "0")
    assert not prepack.applies("int4", fp32, cpu)


def test_only_the_newest_packs_of_a_model_stay_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model keeps its newest packs; another model's packs, even newer ones, count for
    that model only; a pack named by an older pagode (no model in its name) is never read
    again and goes."""
    monkeypatch.setenv("PAGODE_CACHE_DIR", with_the_runs_kernels(tmp_path))
    folder = tmp_path / "prepacked"
    folder.mkdir()
    models = []
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"GGUF" + bytes(60))
        models.append(tmp_path / name)
    cpu, fp32 = torch.device("cpu"), torch.float32
    # six packs of model a (max_tokens keys them apart), then three newer ones of model b
    packs = [prepack.path_for(prepack.pack_key(models[0], "int4", fp32, cpu, 64 * (i + 1))) for i in range(6)]
    others = [prepack.path_for(prepack.pack_key(models[1], "int4", fp32, cpu, 64 * (i + 1))) for i in range(3)]
    legacy = folder / "0123456789abcdef.pt"
    for i, pack in enumerate([*packs, *others, legacy]):
        pack.write_bytes(b"x")
        os.utime(pack, ns=(i * 10**9, i * 10**9))
    assert len({p.name.partition("-")[0] for p in packs}) == 1 and others[0].name[:8] != packs[0].name[:8]
    prepack.prune(folder, keep=packs[0])  # the one just written stays even when it is the oldest
    assert sorted(folder.glob("*.pt")) == sorted([packs[0], packs[4], packs[5], *others])
    assert prepack.KEEP_PACKS == 3


def test_a_pack_that_would_fill_the_disk_is_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A pack is a cache: with less free space than its bytes and the margin, none is written
    and the log says why; with room, the same model is written."""
    model = torch.nn.Linear(256, 256)
    size = prepack.pack_bytes({"state": model.state_dict(), "tied": model.weight})
    assert size == (256 * 256 + 256) * 4  # the tied weight counts once
    monkeypatch.delenv("PAGODE_PACK_KEEP_FREE_GIB", raising=False)
    assert prepack.min_free_bytes() == 4 << 30  # the default margin
    disk = {"free": 0}
    monkeypatch.setattr(prepack.shutil, "disk_usage", lambda _: SimpleNamespace(free=disk["free"]))
    for margin in ("", "0.5"):  # the default, then a margin the variable sets
        monkeypatch.setenv("PAGODE_PACK_KEEP_FREE_GIB", margin)
        path = tmp_path / f"pack{margin}.pt"
        disk["free"] = prepack.min_free_bytes() + size // 2
        caplog.clear()
        with caplog.at_level("WARNING", logger="pagode"):
            prepack.write(model, path, {"k": 1}, "summary", 0.1)
        assert not path.exists() and "not saved" in caplog.text
        disk["free"] = prepack.min_free_bytes() + 2 * size
        prepack.write(model, path, {"k": 1}, "summary", 0.1)
        assert path.exists()
    assert prepack.min_free_bytes() == 1 << 29


def test_the_pack_is_written_at_the_lowest_cpu_priority() -> None:
    """A first start's pack is serialized while the first requests are served: its writer
    thread takes the lowest CPU priority, so that it does not share their cores as an equal,
    and the threads that serve keep theirs."""
    seen: list[int] = []
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    runner = SimpleNamespace(pending_packs=[lambda: seen.append(os.getpriority(os.PRIO_PROCESS,
                                                                               threading.get_native_id()))])
    for thread in ModelRunner.write_packs(runner):  # type: ignore[arg-type]
        thread.join()
    assert seen == [LOWEST_PRIORITY] and runner.pending_packs == []
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
