"""Request bodies of the pooling endpoints: OpenAI's /v1/embeddings, and /v1/rerank and
/v1/score in vLLM's shapes (the Jina/Cohere rerank body). Unknown fields are kept, as on the
generation endpoints; NaN and Infinity are refused, and lists fail fast."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from server.api.protocol import OpenAIModel, PositiveInt, StrictInt

MAX_INPUTS = 2048  # OpenAI's own limit on the inputs of one embeddings request
TokenList = Annotated[list[StrictInt], Field(min_length=1, fail_fast=True)]
Texts = Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS, fail_fast=True)]
TokenLists = Annotated[list[TokenList], Field(min_length=1, max_length=MAX_INPUTS, fail_fast=True)]
# vLLM's: the last N tokens are kept (-1: up to max_model_len); pagode keeps the first N, as the
# tokenizer truncates, so an encoder's [CLS] and [SEP] survive.
Truncate = Annotated[int, Field(strict=True, ge=-1)]


class EmbeddingRequest(OpenAIModel):
    model: str | None = None
    input: str | Texts | TokenList | TokenLists
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: PositiveInt | None = None
    user: str | None = None
    truncate_prompt_tokens: Truncate | None = None
    # pagode's: one of the model's sentence-transformers prompts, put before each text
    prompt_name: str | None = None
    priority: StrictInt = 0  # vLLM's: lower first, under --scheduling-policy priority

    def texts_or_tokens(self) -> list[str] | list[list[int]]:
        """The inputs as a list: of texts, or of token-id lists."""
        given = self.input
        if isinstance(given, str):
            return [given]
        if given and isinstance(given[0], int):
            return [given]  # type: ignore[list-item]
        return given  # type: ignore[return-value]


class Document(OpenAIModel):
    text: str


DocumentList = Annotated[list[str | Document], Field(min_length=1, max_length=MAX_INPUTS, fail_fast=True)]


class RerankRequest(OpenAIModel):
    model: str | None = None
    query: str
    documents: DocumentList
    top_n: Annotated[int, Field(strict=True, ge=0)] | None = None  # None or 0: every document
    return_documents: bool = True
    truncate_prompt_tokens: Truncate | None = None
    instruction: str | None = None  # pagode's: a yes/no reranker's <Instruct> line
    priority: StrictInt = 0

    def document_texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


TextOrTexts = str | Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS, fail_fast=True)]


class ScoreRequest(OpenAIModel):
    model: str | None = None
    text_1: TextOrTexts | None = None
    text_2: TextOrTexts | None = None
    queries: TextOrTexts | None = None  # newer vLLM's names for text_1 and text_2
    documents: TextOrTexts | None = None
    truncate_prompt_tokens: Truncate | None = None
    instruction: str | None = None
    priority: StrictInt = 0

    @model_validator(mode="after")
    def check_pairs(self) -> ScoreRequest:
        first, second = self.text_1 or self.queries, self.text_2 or self.documents
        if first is None or second is None:
            raise ValueError("give text_1 and text_2 (or queries and documents)")
        n1, n2 = (1 if isinstance(t, str) else len(t) for t in (first, second))
        if n1 not in (1, n2):
            raise ValueError(f"text_1 has {n1} texts and text_2 {n2}: give one text_1, or as many as text_2")
        return self

    def pairs(self) -> list[tuple[str, str]]:
        """(query, document) pairs: one text_1 against each text_2, or text_1[i] with text_2[i]."""
        first, second = self.text_1 or self.queries, self.text_2 or self.documents
        lefts = [first] if isinstance(first, str) else list(first or [])
        rights = [second] if isinstance(second, str) else list(second or [])
        if len(lefts) == 1:
            lefts = lefts * len(rights)
        return list(zip(lefts, rights, strict=True))
