"""A thinking budget cuts the thinking and lets the answer follow, on a tiny random Qwen3
served for real: Anthropic's `thinking.budget_tokens` on /v1/messages (the real `anthropic`
SDK, whole and streamed) and vLLM's `thinking_token_budget` on chat. The template opens the
thinking in the prompt, as Qwen3's thinking-only and DeepSeek-R1's templates do, so the
random model thinks from its first token and would never stop by itself: greedy, its
budgeted thinking is exactly its first `budget` tokens, the unbudgeted thinking runs on
past them, and the output goes on after the forced `</think>`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from family_chat import FAMILIES, MAX_POSITIONS, QWEN3_TEMPLATE
from server_fixtures import ServerProcess, running_server
from tiny_models import TinyZoo

from engine.thinking_budget import ThinkingBudget, ThinkingTracker

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.slow

QWEN3 = next(f for f in FAMILIES if f.family == "qwen3")
BUDGET = 6
MAX_TOKENS = 24
ASK = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def server(tiny_zoo: TinyZoo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("thinking-budget")
    template = folder / "qwen3_thinking.jinja"
    template.write_text(open_thinking(QWEN3_TEMPLATE))
    args = ["--model", str(tiny_zoo.folder(QWEN3.chat_spec)), "--served-model-name", "tiny",
            "--chat-template", str(template), "--kv-cache-memory", "32MiB",
            "--max-model-len", str(MAX_POSITIONS)]
    with running_server(args, folder, name="qwen3-thinking") as proc:
        yield proc


def open_thinking(path: Path) -> str:
    """Qwen3's template, with its generation prompt opening the thinking when it is on."""
    text = path.read_text()
    prompt = "{{- '<|im_start|>assistant\\n' }}\n{%- if enable_thinking is defined and enable_thinking is false %}"
    assert prompt in text
    return text.replace(prompt, "{{- '<|im_start|>assistant\\n' }}\n{%- if enable_thinking is not defined "
                        "or enable_thinking is not false %}{{- '<think>\\n' }}{%- endif %}\n"
                        "{%- if enable_thinking is defined and enable_thinking is false %}")


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[Any]:
    async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="local",
                                        max_retries=0, timeout=120) as sdk:
        yield sdk


async def first_tokens_text(server: ServerProcess, count: int) -> str:
    """The text of the first `count` tokens the model writes after the thinking prompt,
    greedy and unconstrained: what a budget of `count` must leave as the thinking."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        prompt = (await http.post("/tokenize", json={
            "messages": ASK, "chat_template_kwargs": {"enable_thinking": True}})).json()["tokens"]
        done = await http.post("/v1/completions", json={
            "prompt": prompt, "max_tokens": count, "temperature": 0, "ignore_eos": True})
    assert done.status_code == 200, done.text
    return str(done.json()["choices"][0]["text"])


def blocks(message: Any, kind: str) -> list[Any]:
    return [block for block in message.content if block.type == kind]


async def message(client: Any, budget: int | None) -> Any:
    thinking = {"type": "enabled", "budget_tokens": budget} if budget else {"type": "enabled"}
    return await client.messages.create(model="tiny", max_tokens=MAX_TOKENS, messages=ASK,
                                        thinking=thinking, extra_body={"temperature": 0})


async def test_the_budget_cuts_the_thinking_and_the_answer_follows(
        client: Any, server: ServerProcess) -> None:
    free = await message(client, None)
    free_thought = blocks(free, "thinking")[0].thinking
    budgeted = await message(client, BUDGET)
    thought = blocks(budgeted, "thinking")[0].thinking
    first = (await first_tokens_text(server, BUDGET)).lstrip()
    assert thought == first, (thought, first)  # exactly the first BUDGET tokens
    assert free_thought.startswith(thought) and len(free_thought) > len(thought)
    # The forced </think> is one more token, and the output went on after it.
    assert budgeted.usage.output_tokens > BUDGET + 1, budgeted
    assert budgeted.stop_reason in ("end_turn", "max_tokens")


async def test_streamed_thinking_keeps_the_budget(client: Any) -> None:
    whole = await message(client, BUDGET)
    async with client.messages.stream(model="tiny", max_tokens=MAX_TOKENS, messages=ASK,
                                      thinking={"type": "enabled", "budget_tokens": BUDGET},
                                      extra_body={"temperature": 0}) as stream:
        final = await stream.get_final_message()
    assert blocks(final, "thinking")[0].thinking == blocks(whole, "thinking")[0].thinking
    assert final.usage.output_tokens == whole.usage.output_tokens


async def test_chat_takes_vllms_thinking_token_budget(server: ServerProcess,
                                                      client: Any) -> None:
    expected = blocks(await message(client, BUDGET), "thinking")[0].thinking
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        chat = await http.post("/v1/chat/completions", json={
            "messages": ASK, "max_tokens": MAX_TOKENS, "temperature": 0,
            "thinking_token_budget": BUDGET})
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["reasoning"] == expected


def test_a_thinking_the_model_opens_itself_is_counted_from_its_start_tag() -> None:
    """As real Qwen3 writes `<think>` as its first token: the budget counts from there, the
    end tag's tokens are forced one by one, and nothing is forced once it has closed."""
    budget = ThinkingBudget(2, start_ids=(7,), end_ids=(8, 9))
    tracker, forced = ThinkingTracker(budget), []
    for token in (5, 7, 1, 2, 8, 9, 3, 4):  # before, <think>, two tokens, </think> (2 ids), after
        forced.append(tracker.forced())
        tracker.observe(token)
    assert forced == [None, None, None, None, 8, 9, None, None]
    assert tracker.done


def test_an_end_marker_ruled_out_is_forced_again_from_its_start() -> None:
    """A grammar or allowed_token_ids that rules the forced token out outranks the budget
    for that step; the marker is asked for again, from its first token, at the next."""
    tracker, forced = ThinkingTracker(ThinkingBudget(1, start_ids=(), end_ids=(8, 9),
                                                     open_in_prompt=True)), []
    for token in (1, 8, 3, 8, 9, 4):  # one token, the marker begun then broken, then whole
        forced.append(tracker.forced())
        tracker.observe(token)
    assert forced == [None, 8, 9, 8, 9, None]
    assert tracker.done
