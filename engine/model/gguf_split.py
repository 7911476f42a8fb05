"""A GGUF split into parts (`NAME-00001-of-0000N.gguf`, as llama.cpp's gguf-split and its
converter's `--split-max-tensors` write, and as hub repos ship big models) read as one file.

The first part carries all the metadata and each part its own tensors, so the parts are
read as they lie, each memory-mapped, and their tensors listed together: nothing is copied
or joined on disk.
"""

from __future__ import annotations

import re
from pathlib import Path

from engine.model.gguf_reader import GGUFHeader

_PART = re.compile(r"-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def part_paths(path: Path) -> list[Path]:
    """Every part of the split file whose first part is `path`; `[path]` when it is whole."""
    found = _PART.search(path.name)
    if found is None:
        return [path]
    if int(found["part"]) != 1:
        raise ValueError(f"{path.name} is part {int(found['part'])} of a split GGUF: give its first part")
    count = int(found["count"])
    stem = path.name[:found.start()]
    parts = [path.with_name(f"{stem}-{n:05d}-of-{count:05d}.gguf") for n in range(1, count + 1)]
    missing = [p.name for p in parts if not p.exists()]
    if missing:
        raise FileNotFoundError(f"the split GGUF {path.name} lacks its parts {', '.join(missing)} in {path.parent}")
    return parts


def read_parts(path: Path) -> GGUFHeader:
    """The header of `path` with the tensors of all its parts, checked against the count the
    first part declares."""
    parts = part_paths(path)
    header = GGUFHeader(parts[0])
    for part in parts[1:]:
        header.tensors.extend(GGUFHeader(part).tensors)
    declared = header.fields.get("split.tensors.count")
    if len(parts) > 1 and declared is not None and int(declared) != len(header.tensors):
        raise ValueError(f"the split GGUF {path.name} declares {declared} tensors; its parts hold "
                         f"{len(header.tensors)}")
    return header
