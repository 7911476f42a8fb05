"""A byte-level tokenizer for tiny models that chat: every text tokenizes (to bytes and a few
whole words, so a grammar can force any reply), and every family's chat markup is an added token,
so a rendered prompt holds the same special ids a real checkpoint's would.

One vocabulary serves every family (its size is CHAT_VOCAB); a family picks its BOS and EOS
strings and its template (`save_chat_tokenizer`).
"""

from __future__ import annotations

from pathlib import Path

# Control tokens, special in each family's tokenizer (skipped when decoding with
# skip_special_tokens): Llama 3, ChatML, Mistral v3, Gemma, Phi-4-mini, Granite, Tülu.
SPECIALS = (
    "<unk>", "<s>", "</s>",
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eot_id|>", "<|eom_id|>", "<|python_tag|>",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>",
    "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
    "<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>",
    "<|tool_call|>", "<|/tool_call|>", "<|tool_response|>",
    "<|start_of_role|>", "<|end_of_role|>",
)
# Added but not special, as in Qwen's and SmolLM3's tokenizers: the reasoning and tool-call
# tags stay in decoded text, where the parsers read them.
MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
# Whole words, as a real BPE has them, so that the replies the tests force (JSON tool calls)
# take a third fewer decode steps; the words' prefixes come with them, merge by merge.
WORDS = ("name", "arguments", "parameters", "get", "weather", "city", "Paris", "tool", "call",
         "functools", "think", "sunny")


def word_merges() -> list[tuple[str, str]]:
    """The merges that build each of WORDS from its letters, left to right."""
    merges: list[tuple[str, str]] = []
    for word in WORDS:
        for end in range(2, len(word) + 1):
            pair = (word[:end - 1], word[end - 1])
            if pair not in merges:
                merges.append(pair)
    return merges


CHAT_VOCAB = len(SPECIALS) + len(MARKUP) + 256 + len(word_merges())


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (what ByteLevel pre-tokenizing yields)."""
    from tokenizers import pre_tokenizers

    return sorted(pre_tokenizers.ByteLevel.alphabet())


def token_id(token: str) -> int:
    """The id of a special or markup token in the chat vocabulary."""
    return (SPECIALS + MARKUP).index(token)


def save_chat_tokenizer(path: Path, template: str, bos: str, eos: str) -> None:
    """A byte-level BPE (bytes and WORDS), the family's BOS/EOS and chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    added = SPECIALS + MARKUP
    vocab = {tok: i for i, tok in enumerate(added)}
    for piece in [*byte_alphabet(), *("".join(pair) for pair in word_merges())]:
        vocab[piece] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=word_merges(), unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token=bos,
                                  eos_token=eos)
    tok.chat_template = template
    tok.save_pretrained(path)
