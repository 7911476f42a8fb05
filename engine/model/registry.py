"""Every model family pagode serves, by HF `model_type` and GGUF `general.architecture`.

A family entry (engine/model/family.py) says how its config maps onto ModelConfig, which
model class runs it, how its GGUF tensors are named and what it supports. Each family module
registers its own entry here, so this table knows no family by name and the families import
it, never the reverse; engine/model/families.py imports every family module once. To add a
family: write its module beside llama.py ending in `FAMILY = register(Family(...))`, import
it in families.py, and add a row to tests/test_families.py; docs/models.md's table is
generated from the registered families (families.families_table()).
"""

from __future__ import annotations

from engine.model.family import Family

_BY_MODEL_TYPE: dict[str, Family] = {}
_BY_GGUF_ARCH: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Adds `family`; a second family under the same model_type or GGUF arch is refused, since
    a lookup could then return either."""
    if family.model_type in _BY_MODEL_TYPE:
        raise ValueError(f"model_type {family.model_type!r} is registered twice")
    if family.gguf_arch is not None and family.gguf_arch in _BY_GGUF_ARCH:
        raise ValueError(f"GGUF architecture {family.gguf_arch!r} is registered twice")
    _BY_MODEL_TYPE[family.model_type] = family
    if family.gguf_arch is not None:
        _BY_GGUF_ARCH[family.gguf_arch] = family
    return family


def registered() -> tuple[Family, ...]:
    """The registered families in model_type order, so the docs table does not depend on the
    order in which their modules were imported."""
    return tuple(_BY_MODEL_TYPE[t] for t in sorted(_BY_MODEL_TYPE))


def served() -> str:
    return ", ".join(f.model_type for f in registered())


def family_for_hf(model_type: str) -> Family:
    family = _BY_MODEL_TYPE.get(model_type)
    if family is None:
        raise ValueError(f"unsupported model_type {model_type!r}; pagode serves {served()} "
                         f"(docs/models.md)")
    return family


def family_for_gguf(arch: str) -> Family:
    family = _BY_GGUF_ARCH.get(arch)
    if family is None:
        archs = ", ".join(sorted(_BY_GGUF_ARCH))
        raise ValueError(f"unsupported GGUF architecture {arch!r}; pagode serves {archs} (docs/models.md)")
    return family
