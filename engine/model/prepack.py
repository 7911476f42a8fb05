"""A quantized model's ready-to-run weights kept across starts, read back through a memory map.

Why: a start spends most of its time before serving in turning the model file into the
weights the kernels run on (GGUF blocks laid out for the kernels, Q/K rows unpermuted, shards
fused into qkv and gate-up blocks, bf16 copies for the big-step GEMM dequantized from the
blocks, the embedding in fp32), and that work gives the same bytes every time. After the
first start the result is saved under PAGODE_CACHE_DIR/prepacked/ (by a thread, once the
engine serves: ModelRunner.write_packs), and later starts map that file (torch.load(mmap=True)) instead:
no copy is made, the pages come from the OS page cache, and servers started side by side
share them.

A pack is keyed by everything its bytes depend on: the model file(s) (path, size, mtime),
the resolved quantization mode, dtype and device, the most tokens a step runs (it decides
which dense copies a layer keeps), the machine of the load-time races (engine/tuning/race_memory.py:
CPU, ISA level, kernel build, torch version, threads), the env switches that pin a race, a
hash of the Python sources that build the weights, and FORMAT_VERSION. `--warmup` and
PAGODE_RACE_CACHE=0 neither read nor write one, since a pack carries race winners. A file
that cannot be read (truncated, corrupt, another key) is packed again, never a failed start;
a pack is written to a temporary file and renamed into place.

A oneDNN-reordered weight is opaque to torch.save, so a pack holds its fp32 source (the
reorder gives it back exactly) and a read reorders it again: milliseconds a layer, against
the seconds of dequantizing and fusing. Layers whose big-step GEMM is another kind (fbgemm's
int8) are not packed, and such a model loads as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine import envs
from engine.model.llama import LlamaForCausalLM
from engine.quant.apply import set_module
from engine.quant.bf16_gemm import Bf16Gemm
from engine.quant.dense_gemm import DenseGemm
from engine.quant.formats import BlockParts, Blocks, BlockWeights
from engine.quant.linear import QuantLinear
from engine.quant.onednn_gemm import OnednnGemm
from engine.tuning import gemm_choice, kernel_crossover, race_memory

log = logging.getLogger("pagode")

FORMAT_VERSION = 5  # bump when the layout of a pack changes
PACKABLE_GEMMS = ("fp32", "bf16", "onednn")
# A model's packs kept: a pack is hundreds of MiB, and every code or flag change keys a new
# one. Other models' packs are not counted, so that serving several models, or starting a
# small one beside, does not evict a model's pack and pack it again at its next start.
KEEP_PACKS = 3
# The races whose winners a pack's layers carry: a start from the pack runs none of them, and
# lists their results as kept (engine/tuning/tuning.py's kernel_choices).
LAYER_RACES = (kernel_crossover.BLOCK_KERNEL, gemm_choice.RACE, kernel_crossover.TILE_BODY)

_SOURCES = (Path(__file__).resolve().parent, Path(__file__).resolve().parents[1] / "quant")


def model_files(path: Path) -> list[Path]:
    """The files whose bytes make the model: the GGUF, or a folder's config and checkpoints."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".json") and p.is_file())


def identity(path: Path) -> list[list[Any]]:
    return [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in model_files(path)]


def sources_digest() -> str:
    """A hash of the code that builds the weights, so that a changed loader never reads an old pack."""
    digest = hashlib.sha256()
    for folder in _SOURCES:
        for source in sorted(folder.glob("*.py")):
            digest.update(source.name.encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def pack_key(model_path: Path, mode: str, dtype: torch.dtype, device: torch.device, max_tokens: int) -> dict[str, Any]:
    key = {"format": FORMAT_VERSION, "model": identity(model_path), "mode": mode, "dtype": str(dtype),
            "device": str(device), "max_tokens": max_tokens, "machine": race_memory.machine(),
            "quant_gemm": envs.QUANT_GEMM.get(), "crossover": envs.QUANT_CROSSOVER.get(),
            "tiles": envs.QUANT_TILES.get(), "tile_bf16": envs.TILE_BF16.get(),
            "tile_int8": envs.TILE_INT8.get(),
            "sources": sources_digest()}
    return dict(json.loads(json.dumps(key)))  # plain JSON types (torch.__version__ is a str subclass)


def path_for(key: dict[str, Any]) -> Path:
    """MODEL-KEY.pt: MODEL names the model's files by their paths alone, so that the packs of
    one model, whatever their flags, sources or the files' dates, are pruned together."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return envs.CACHE_DIR.get() / "prepacked" / f"{model_tag(key)}-{digest}.pt"


def model_tag(key: dict[str, Any]) -> str:
    paths = [entry[0] for entry in key["model"]]
    return hashlib.sha256(json.dumps(paths).encode()).hexdigest()[:8]


def applies(mode: str, dtype: torch.dtype, device: torch.device) -> bool:
    """Packs hold quantized CPU models only; `--warmup` and PAGODE_RACE_CACHE=0 skip them."""
    return mode != "none" and device.type == "cpu" and dtype == torch.float32 and race_memory.reads()


# ---- reading -----------------------------------------------------------------------------
def read(path: Path, key: dict[str, Any], empty: LlamaForCausalLM) -> tuple[LlamaForCausalLM, str] | None:
    """`empty` (built on the meta device) filled from the pack at `path`, and the pack's report;
    None when there is no usable pack."""
    if not path.exists():
        return None
    start = time.perf_counter()
    try:
        pack = torch.load(path, mmap=True, weights_only=True)
        if pack.get("key") != key:
            raise ValueError("it was packed for another key")
        model = restore(pack, empty)
        race_memory.retake(pack.get("races", {}))
    except Exception as err:  # any unreadable pack costs a repack, never a start
        log.warning("weights: the prepacked file %s is unusable (%s: %s); packing again", path,
                    type(err).__name__, str(err).splitlines()[0][:200] if str(err) else "")
        return None
    log.info("weights: read prepacked from %s in %.2f s", path, time.perf_counter() - start)
    return model, str(pack["summary"])


def restore(pack: dict[str, Any], model: LlamaForCausalLM) -> LlamaForCausalLM:
    for name, entry in pack["linears"].items():
        set_module(model, name, QuantLinear(blocks_from(entry["blocks"]), gemm_from(entry["gemm"]),
                                            entry["bias"], int(entry["max_kernel_tokens"])))
    model.load_state_dict(pack["state"], strict=True, assign=True)
    with torch.device("cpu"):
        model.build_rope()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"the pack left {left[:3]} unfilled")
    return model.eval()


def blocks_from(entry: list[dict[str, Any]] | None) -> Blocks | None:
    if entry is None:
        return None
    parts = tuple(BlockWeights(p["kind"], p["qs"], p["scales"], p["mins"], int(p["out_features"]),
                               int(p["in_features"]), int(p["tile_from"]), bool(p["int8_tokens"])) for p in entry)
    return parts[0] if len(parts) == 1 else BlockParts(parts)


def gemm_from(entry: dict[str, Any] | None) -> DenseGemm | Bf16Gemm | OnednnGemm | None:
    if entry is None:
        return None
    if entry["name"] == "bf16":
        return Bf16Gemm(entry["weight"], entry["bias"])
    if entry["name"] == "onednn":
        return OnednnGemm(entry["weight"], entry["bias"])
    return DenseGemm(entry["weight"], entry["bias"], bool(entry["shared"]))


# ---- writing -----------------------------------------------------------------------------
def why_not_packable(model: nn.Module) -> str | None:
    for name, module in model.named_modules():
        if isinstance(module, QuantLinear) and module.gemm is not None and module.gemm.name not in PACKABLE_GEMMS:
            return f"{name}'s big-step GEMM is {module.gemm.name}"
    return None


def write(model: nn.Module, path: Path, key: dict[str, Any], summary: str, packed_s: float) -> None:
    """Save the model's weights as a pack; a failure is logged, and the next start packs again."""
    why = why_not_packable(model)
    if why:
        log.info("weights: packed in %.2f s; not saved (%s)", packed_s, why)
        return
    start = time.perf_counter()
    pack = {"key": key, "summary": summary, "state": model.state_dict(), "linears": {
        name: linear_entry(module) for name, module in model.named_modules() if isinstance(module, QuantLinear)},
        # through JSON text, so that equal results pickle alike whether raced or read back
        "races": json.loads(json.dumps(race_memory.taken_of(LAYER_RACES), sort_keys=True))}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        size, free, keep_free = pack_bytes(pack), shutil.disk_usage(path.parent).free, min_free_bytes()
        if free - size < keep_free:
            log.warning("weights: packed in %.2f s; not saved: the pack's %.1f GiB would leave %.1f GiB free on "
                        "the disk of %s (at least %g GiB is kept free: PAGODE_PACK_KEEP_FREE_GIB)", packed_s,
                        size / 2**30, (free - size) / 2**30, path.parent, keep_free / 2**30)
            return
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as f:
            try:
                torch.save(pack, f)
            except BaseException:
                os.unlink(f.name)
                raise
        os.replace(f.name, path)  # atomic: a start side by side reads the old pack or the new one
    except (OSError, RuntimeError) as err:
        log.warning("weights: packed in %.2f s; could not save them to %s: %s", packed_s, path, err)
        return
    log.info("weights: packed in %.2f s, saved to %s in %.2f s", packed_s, path, time.perf_counter() - start)
    prune(path.parent, keep=path)


def min_free_bytes() -> int:
    """A pack is a cache: it is not written where it would leave less than this free on the
    disk, since the disk may be the one the models, the logs and other programs need."""
    return int(envs.PACK_KEEP_FREE_GIB.get() * 2**30)


def pack_bytes(pack: Any) -> int:
    """The bytes of every distinct tensor storage in the pack (tied weights count once)."""
    seen: dict[int, int] = {}

    def visit(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
    visit(pack)
    return sum(seen.values())


def prune(folder: Path, keep: Path) -> None:
    """Delete all but the KEEP_PACKS most recently written packs of `keep`'s model, so that
    upgrades and changed flags do not pile up stale copies of its weights on disk; `keep`
    (just written) stays. Packs named without a model (an older pagode's) are never read
    again, and go too."""
    model = keep.stem.partition("-")[0]
    packs = sorted(folder.glob(f"{model}-*.pt"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    older = [p for p in folder.glob("*.pt") if "-" not in p.stem and p != keep]
    for stale in [p for p in packs if p != keep][KEEP_PACKS - 1:] + older:
        try:
            stale.unlink()
            log.info("weights: removed the older pack %s (keeping the %d newest of each model)", stale, KEEP_PACKS)
        except OSError:
            continue  # another process removed it first, or it is not ours to remove


def linear_entry(layer: QuantLinear) -> dict[str, Any]:
    b, g = layer.blocks, layer.gemm
    blocks = None if b is None else [{"kind": p.kind, "qs": p.qs, "scales": p.scales, "mins": p.mins,
                                      "out_features": p.out_features, "in_features": p.in_features,
                                      "tile_from": p.tile_from, "int8_tokens": p.int8_tokens}
                                     for p in b.parts]
    gemm = None
    if isinstance(g, DenseGemm | Bf16Gemm):
        shared = isinstance(g, DenseGemm) and g.nbytes == 0  # the tied embedding's weight
        gemm = {"name": g.name, "weight": g.weight, "bias": g.bias, "shared": shared}
    elif isinstance(g, OnednnGemm):
        gemm = {"name": g.name, "weight": g.packed.to_dense(), "bias": g.bias, "shared": False}
    return {"blocks": blocks, "gemm": gemm, "bias": None if layer.bias is None else layer.bias.detach(),
            "max_kernel_tokens": layer.max_kernel_tokens}
