"""Tiny random pooling checkpoints in sentence-transformers' folder layout: BERT, XLM-RoBERTa
and nomic-bert embedders, a Qwen3 last-token embedder, BERT and XLM-RoBERTa cross-encoders and
a Qwen3 yes/no reranker. Each is built with transformers' own config and model classes and
saved the way sentence-transformers saves it, so the references load them as users' models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

WORDS = ("the", "cat", "sat", "on", "mat", "dog", "ran", "far", "paris", "is", "capital", "of", "france",
         "what", "where", "a", "city", "river", "blue", "sky", "search", "query", "passage", "yes", "no")
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
ENCODER: dict[str, Any] = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                               max_position_embeddings=128, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0, initializer_range=0.2)
QWEN3: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, rope_theta=5000.0,
                             initializer_range=0.2, tie_word_embeddings=True)
QUERY_PROMPT = "Instruct: find the passage\nQuery:"


def wordpiece_vocab(specials: list[str]) -> list[str]:
    return specials + LETTERS + [f"##{c}" for c in LETTERS] + list(WORDS)


def save_bert_tokenizer(path: Path) -> None:
    from transformers import BertTokenizerFast

    vocab = {tok: i for i, tok in enumerate(wordpiece_vocab(BERT_SPECIALS))}
    BertTokenizerFast(vocab=vocab, model_max_length=128).save_pretrained(path)


def save_xlmr_tokenizer(path: Path) -> None:
    from transformers import XLMRobertaTokenizerFast

    pieces = ROBERTA_SPECIALS + ["▁" + w for w in WORDS] + LETTERS + ["▁" + c for c in LETTERS]
    vocab = [(p, 0.0 if i < len(ROBERTA_SPECIALS) else -1.0 - 0.01 * i) for i, p in enumerate(pieces)]
    XLMRobertaTokenizerFast(vocab=vocab, model_max_length=128).save_pretrained(path)


def save_qwen3_tokenizer(path: Path) -> None:
    """Byte-level BPE with Qwen's markup as special tokens and yes/no as whole tokens, as in
    Qwen3's own vocabulary; right padding with <|endoftext|>."""
    from chat_tokenizer import save_chat_tokenizer

    save_chat_tokenizer(path, "{{ messages }}", "<|im_start|>", "<|endoftext|>")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    tok.add_tokens(["yes", "no"])
    tok.pad_token = "<|endoftext|>"
    tok.save_pretrained(path)


@torch.no_grad()
def randomize(model: torch.nn.Module) -> None:
    """Norm weights start at 1 and biases at 0: a loader that dropped them would still pass."""
    torch.manual_seed(1)
    for name, param in model.named_parameters():
        if param.dim() == 1 and "norm" in name.lower():
            param.normal_(1.0, 0.3)
        elif name.endswith(".bias"):
            param.normal_(0.0, 0.3)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


def write_st_layout(path: Path, pooling: str, normalize: bool, prompts: dict[str, str] | None = None,
                    max_seq_length: int = 128) -> None:
    """modules.json, 1_Pooling/config.json, [2_Normalize], config_sentence_transformers.json."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (path / "2_Normalize").mkdir(exist_ok=True)
    write_json(path / "modules.json", modules)
    keys = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "last": "pooling_mode_lasttoken"}
    pool_config = {"word_embedding_dimension": 64, **{k: k == keys[pooling] for k in keys.values()},
                   "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
                   "pooling_mode_weightedmean_tokens": False, "include_prompt": True}
    write_json(path / "1_Pooling" / "config.json", pool_config)
    write_json(path / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    write_json(path / "config_sentence_transformers.json",
               {"prompts": prompts or {}, "default_prompt_name": None, "similarity_fn_name": "cosine"})


def build_bert(path: Path, pooling: str = "mean", normalize: bool = True) -> Path:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=len(wordpiece_vocab(BERT_SPECIALS)), hidden_act="gelu", **ENCODER),
                      add_pooling_layer=False)
    randomize(model)
    model.save_pretrained(path)
    save_bert_tokenizer(path)
    write_st_layout(path, pooling, normalize, {"query": "query: ", "passage": "passage: "})
    return path


def build_xlmr(path: Path, pooling: str = "cls", normalize: bool = True) -> Path:
    from transformers import XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(0)
    cfg = XLMRobertaConfig(vocab_size=len(ROBERTA_SPECIALS) + len(WORDS) + 2 * len(LETTERS), type_vocab_size=1,
                           pad_token_id=1, bos_token_id=0, eos_token_id=2,
                           **{**ENCODER, "max_position_embeddings": 130})
    model = XLMRobertaModel(cfg, add_pooling_layer=False)
    randomize(model)
    model.save_pretrained(path)
    save_xlmr_tokenizer(path)
    write_st_layout(path, pooling, normalize)
    return path


def build_nomic(path: Path, pooling: str = "mean", normalize: bool = True) -> Path:
    from transformers import NomicBertConfig, NomicBertModel

    torch.manual_seed(0)
    cfg = NomicBertConfig(vocab_size=len(wordpiece_vocab(BERT_SPECIALS)), hidden_act="silu",
                          rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, **ENCODER)
    model = NomicBertModel(cfg)
    randomize(model)
    model.save_pretrained(path)
    save_bert_tokenizer(path)
    prompts = {"search_query": "search_query: ", "search_document": "search_document: "}
    write_st_layout(path, pooling, normalize, prompts)
    return path


def modernbert_config(num_labels: int = 0) -> Any:
    """Three layers (global, local, local) with a window of 4 on each side, so that the local
    layers cut the longer test inputs."""
    from transformers import ModernBertConfig

    return ModernBertConfig(vocab_size=len(wordpiece_vocab(BERT_SPECIALS)), hidden_size=64, num_hidden_layers=3,
                            num_attention_heads=4, intermediate_size=96, max_position_embeddings=128,
                            local_attention=8, pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2,
                            eos_token_id=3, initializer_range=0.2, norm_bias=True, classifier_pooling="mean",
                            num_labels=num_labels or 2)


def build_modernbert(path: Path, pooling: str = "mean", normalize: bool = True) -> Path:
    from transformers import ModernBertModel

    torch.manual_seed(0)
    model = ModernBertModel(modernbert_config())
    randomize(model)
    model.save_pretrained(path)
    save_bert_tokenizer(path)
    write_st_layout(path, pooling, normalize)
    return path


def build_qwen3_embedder(path: Path, smollm_tokenizer: bool = False) -> Path:
    """With smollm_tokenizer, SmolLM2's real BPE (49,152 tokens), whose pre-tokenizer llama.cpp's
    converter knows (it refuses a toy one); else the small byte-level one."""
    from chat_tokenizer import CHAT_VOCAB
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(0)
    vocab = 49152 if smollm_tokenizer else CHAT_VOCAB + 2
    model = Qwen3Model(Qwen3Config(vocab_size=vocab, **QWEN3))
    randomize(model)
    model.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["Qwen3ForCausalLM"]  # as Qwen3-Embedding's folder declares it
    write_json(path / "config.json", config)
    if smollm_tokenizer:
        from converter_files import smollm_tokenizer as smollm

        smollm().save_pretrained(path)
    else:
        save_qwen3_tokenizer(path)
    write_st_layout(path, "last", True, {"query": QUERY_PROMPT, "document": ""})
    return path


def build_cross_encoder(path: Path, arch: str = "bert") -> Path:
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        XLMRobertaConfig,
        XLMRobertaForSequenceClassification,
    )

    torch.manual_seed(0)
    if arch == "bert":
        cfg = BertConfig(vocab_size=len(wordpiece_vocab(BERT_SPECIALS)), num_labels=1, **ENCODER)
        model: torch.nn.Module = BertForSequenceClassification(cfg)
    elif arch == "modernbert":
        from transformers import ModernBertForSequenceClassification

        model = ModernBertForSequenceClassification(modernbert_config(num_labels=1))
    else:
        cfg = XLMRobertaConfig(vocab_size=len(ROBERTA_SPECIALS) + len(WORDS) + 2 * len(LETTERS), type_vocab_size=1,
                               pad_token_id=1, bos_token_id=0, eos_token_id=2, num_labels=1,
                               **{**ENCODER, "max_position_embeddings": 130})
        model = XLMRobertaForSequenceClassification(cfg)
    randomize(model)
    model.save_pretrained(path)  # type: ignore[operator]
    (save_xlmr_tokenizer if arch == "xlmr" else save_bert_tokenizer)(path)
    config = json.loads((path / "config.json").read_text())
    config["sentence_transformers"] = {"activation_fn": "torch.nn.modules.activation.Sigmoid"}
    write_json(path / "config.json", config)
    return path


def build_qwen3_reranker(path: Path) -> Path:
    """A Qwen3ForCausalLM marked as vLLM's hf_overrides mark Qwen3-Reranker: scored by
    sigmoid(logit(yes) - logit(no)) at the last token."""
    from chat_tokenizer import CHAT_VOCAB
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=CHAT_VOCAB + 2, **QWEN3))
    randomize(model)
    model.save_pretrained(path)
    save_qwen3_tokenizer(path)
    config = json.loads((path / "config.json").read_text())
    config.update(classifier_from_token=["no", "yes"], is_original_qwen3_reranker=True)
    write_json(path / "config.json", config)
    return path
