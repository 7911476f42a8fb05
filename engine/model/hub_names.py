"""What a hub name asks for: `ORG/REPO` (a safetensors folder) or `ORG/REPO:QUANT` (one GGUF
of a repo holding several), and which of the repo's files that means.

The GGUF pick is llama.cpp's `-hf` rule, so that a name typed for `llama-server -hf` fetches
the same file here: the first model `.gguf` whose path holds the tag followed by `.` or `-`
(case-insensitive), mmproj and imatrix files never; no tag means Q4_K_M, else Q8_0, else the
first file; a split file is matched by its first part and brings all its parts.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

# A repo id as the hub spells one (owner/name), with an optional `:tag`.
_HUB_NAME = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?::(?P<quant>[\w.-]+))?$")
_SPLIT = re.compile(r"-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_QUANT_LABEL = re.compile(r"(?i)(?:UD-)?(?:I?Q\d[\w]*|BF16|F16|F32)")
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")
# What serving a safetensors folder reads: the config, the weights and the tokenizer with its
# chat template. Anything else a repo holds (other weight formats, images, ONNX, original
# checkpoints) stays on the hub.
FOLDER_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json")
FOLDER_SKIPPED = ("*/*", "consolidated*.safetensors")  # subfolders hold other formats


@dataclass(frozen=True)
class HubName:
    repo: str
    quant: str | None  # set: a GGUF repo, the tag picks the file

    def __str__(self) -> str:
        return self.repo if self.quant is None else f"{self.repo}:{self.quant}"


class MissingQuant(ValueError):
    """The repo has no GGUF for the tag asked; the message lists the ones it has."""


def parse_hub_name(text: str) -> HubName | None:
    """The hub name `text` spells, or None when it cannot be one (then it is a local path)."""
    found = _HUB_NAME.match(text)
    if found is None or text.startswith((".", "/", "~")):
        return None
    return HubName(found["repo"], found["quant"])


def is_gguf_repo(name: HubName, files: list[str]) -> bool:
    """A tag always means GGUF; without one, a repo of GGUFs and no safetensors is one too
    (llama.cpp's `-hf` takes such a repo without a tag)."""
    if name.quant is not None:
        return True
    return any(f.endswith(".gguf") for f in files) and not any(f.endswith(".safetensors") for f in files)


def folder_files(files: list[str]) -> list[str]:
    """The files of a safetensors folder that serving needs."""
    wanted = [f for f in files if any(fnmatch.fnmatchcase(f, p) for p in FOLDER_FILES)
              and not any(fnmatch.fnmatchcase(f, p) for p in FOLDER_SKIPPED)]
    return sorted(wanted)


def pick_gguf(files: list[str], quant: str | None) -> list[str]:
    """The GGUF file (all its parts, in order, when split) that `quant` names in `files`."""
    candidates = [f for f in files if _is_model_gguf(f)]
    if not candidates:
        raise MissingQuant("the repo holds no model .gguf file")
    for tag in (quant,) if quant is not None else DEFAULT_QUANTS:
        pattern = re.compile(re.escape(tag) + r"[.-]", re.IGNORECASE)
        for path in candidates:
            if pattern.search(path.rsplit("/", 1)[-1]):
                return split_parts(path, files)
    if quant is None:
        return split_parts(candidates[0], files)
    raise MissingQuant(f"no GGUF file for the quant {quant!r}; the repo has: "
                       f"{', '.join(available_quants(files)) or 'none'}")


def available_quants(files: list[str]) -> list[str]:
    """The quant tags the repo's GGUFs carry (the last one in each file name)."""
    tags: list[str] = []
    for path in files:
        if _is_model_gguf(path):
            stem = _SPLIT.sub("", path.rsplit("/", 1)[-1]).removesuffix(".gguf")
            labels = _QUANT_LABEL.findall(stem)
            tag = labels[-1].upper() if labels else stem
            if tag not in tags:
                tags.append(tag)
    return tags


def split_parts(first: str, files: list[str]) -> list[str]:
    """`first` and, when it is part 1 of a split GGUF, every part; a missing part is an error."""
    found = _SPLIT.search(first)
    if found is None:
        return [first]
    count = int(found["count"])
    prefix = first[:found.start()]
    parts = [f"{prefix}-{n:05d}-of-{count:05d}.gguf" for n in range(1, count + 1)]
    missing = [p for p in parts if p not in files]
    if missing:
        raise MissingQuant(f"the split GGUF {first} lacks its parts {', '.join(missing)}")
    return parts


def _is_model_gguf(path: str) -> bool:
    """A model's .gguf, or the first part of a split one; projectors and imatrix files are not."""
    name = path.rsplit("/", 1)[-1].lower()
    if not name.endswith(".gguf") or "mmproj" in name or "imatrix" in name:
        return False
    found = _SPLIT.search(name)
    return found is None or int(found["part"]) == 1
