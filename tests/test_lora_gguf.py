"""llama.cpp's GGUF LoRA (`convert_lora_to_gguf.py`, run on a PEFT adapter made by `peft`)
serves the same tokens as the PEFT folder: transformers with the adapter merged, on tiny
Llama (whose Q/K rows the converter interleaves) and Qwen3 (which it leaves as they are)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from converter_files import llama_cpp_tool
from lora_adapters import save_random_adapter
from reference import assert_greedy_match
from tiny_models import TinySpec, TinyZoo, cached_greedy, one_torch_thread, prompts, tiny_spec

from engine import LLM, SamplingParams
from engine.lora import LoraError

SPECS = [tiny_spec("llama", "LlamaConfig", "LlamaForCausalLM", "llama"),
         tiny_spec("qwen3", "Qwen3Config", "Qwen3ForCausalLM", "qwen3", head_dim=32)]
NEW_TOKENS = 24


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def convert_lora(base: Path, adapter: Path, out: Path) -> Path:
    """llama.cpp's own converter, beside convert_hf_to_gguf.py in the same checkout."""
    script = Path(llama_cpp_tool("converter")).with_name("convert_lora_to_gguf.py")
    done = subprocess.run([sys.executable, str(script), "--base", str(base), "--outtype", "f32",
                           "--outfile", str(out), str(adapter)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_gguf_lora_matches_peft_merged(tiny_zoo: TinyZoo, spec: TinySpec, tmp_path: Path) -> None:
    base = tiny_zoo.folder(spec)
    # Not rsLoRA: the converter drops use_rslora, and llama.cpp scales by alpha / r.
    merged = save_random_adapter(base, tmp_path / "peft", 16, 21)
    gguf = convert_lora(base, tmp_path / "peft", tmp_path / "lora.gguf")
    llm = LLM(model=str(base), enable_lora=True, max_lora_rank=16, lora_modules={"g": str(gguf)},
              max_model_len=128, kv_cache_dtype="fp32", quantization="none")
    ids = prompts(3)
    outs = llm.generate(ids, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True),
                        lora_name=["g", None, "g"])
    for prompt, lora, out in zip(ids, ["g", None, "g"], outs, strict=True):
        ref = merged if lora else tiny_zoo.reference(spec)
        assert_greedy_match(ref, prompt, out.outputs[0].token_ids, cached_greedy(ref, prompt, NEW_TOKENS))
    assert cached_greedy(merged, ids[0], NEW_TOKENS) != cached_greedy(tiny_zoo.reference(spec), ids[0], NEW_TOKENS)


def test_a_model_gguf_is_no_adapter(tiny_zoo: TinyZoo) -> None:
    spec = SPECS[0]
    llm = LLM(model=str(tiny_zoo.folder(spec)), enable_lora=True, max_model_len=128, quantization="none")
    with pytest.raises(LoraError, match="not a LoRA adapter"):
        llm.engine.load_lora_adapter("m", str(tiny_zoo.gguf(spec, "F32")[0]))
