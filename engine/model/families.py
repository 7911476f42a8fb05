"""Every family pagode serves, registered once: importing this module imports each family
module, and each registers its own entry (engine/model/registry.py). The package imports it
(engine/model/__init__.py), so a lookup by model_type or GGUF arch always finds them all.
"""

from __future__ import annotations

from engine.model import gemma2, gemma3, granite, llama_like, mixtral, olmo2, olmoe, phi3, qwen3, qwen3_moe, smollm3
from engine.model.family import Family, Support
from engine.model.registry import registered

MODULES = (llama_like, qwen3, phi3, granite, olmo2, smollm3, qwen3_moe, olmoe, mixtral, gemma2, gemma3)
FAMILIES: tuple[Family, ...] = registered()


def families_table() -> str:
    """The Markdown table of docs/models.md (tests/test_models_doc.py checks the page holds it).

    "proved": what tests/test_families.py and tests/test_family_quantization.py check: greedy
    output equal to transformers' loaded from an HF folder and from a GGUF, and the quantized
    modes' quality gate."""
    rows = ["| family (`model_type`) | GGUF arch | proved | int8/int4 | fused CPU decode step | Triton | notes |",
            "|---|---|---|---|---|---|---|"]
    for f in FAMILIES:
        s: Support = f.support
        rows.append(f"| {f.model_type} | {f.gguf_arch or '-'} | {', '.join(s.proved) or '-'} | "
                    f"{_yes(s.quantization)} | {_yes(s.fused_cpu_step)} | {_yes(s.triton)} | {f.notes} |")
    return "\n".join(rows) + "\n"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
