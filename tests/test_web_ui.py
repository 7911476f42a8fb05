"""The web page at / in a real browser: Debian's Chromium, driven by Playwright for Python,
against the real server on the loopback (the shared session server; one more with
--api-key). `make test` installs Chromium (scripts/install-browser.sh); without it these
tests skip with the reason.

The page's Content-Security-Policy forbids eval, so every predicate handed to
wait_for_function is a function, which Playwright runs without eval.

Set PAGODE_UI_SCREENSHOTS=docs to have the chat and live-view tests save the screenshots
that the README shows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from server_fixtures import SMALL_ARGS, ServerProcess, metric_value, running_server

from engine.config import EngineConfig
from server.app import create_app
from server.settings import ServerSettings

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

CHROMIUM = os.environ.get("PAGODE_CHROMIUM") or shutil.which("chromium") or shutil.which(
    "chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no system Chromium (scripts/install-browser.sh installs it as root)")
API_KEY = "sk-web-ui-test"
WAIT_MS = 180_000  # a reply or a burst on a busy 2-core machine; a bound on waiting, not speed
SCREENSHOTS = os.environ.get("PAGODE_UI_SCREENSHOTS")


class PageWatch:
    """What went wrong in the page: console errors, uncaught errors, requests that failed or
    were answered with an error status."""

    def __init__(self, page: Any) -> None:
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []
        self.failed: list[str] = []
        self.requests: list[Any] = []
        page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.page_errors.append(str(e)))
        page.on("requestfailed", lambda r: self.failed.append(f"{r.url}: {r.failure}"))
        page.on("response", lambda r: self.failed.append(f"{r.url}: {r.status}")
                if r.status >= 400 else None)
        page.on("request", lambda r: self.requests.append(r))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("no system Chromium (scripts/install-browser.sh installs it as root)")
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM,
                                              args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


def open_page(browser: Any, base_url: str) -> tuple[Any, PageWatch]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    watch = PageWatch(page)
    page.goto(base_url + "/")
    return page, watch


@pytest.fixture
def page_on(browser: Any, server: ServerProcess) -> Iterator[tuple[Any, PageWatch]]:
    page, watch = open_page(browser, server.base_url)
    yield page, watch
    page.context.close()


def wait_live(page: Any, min_points: int = 1) -> None:
    """Until the live view's stream is open and has sent points."""
    page.wait_for_function(f"() => pagode.live.connected && pagode.live.fine.length >= {min_points}")


def send_prompt(page: Any, text: str, max_tokens: int = 48) -> None:
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#prompt", text)
    page.click("#send")


def wait_reply_done(page: Any) -> None:
    page.wait_for_selector(".message.assistant:not(.streaming)", state="attached")
    page.wait_for_function("() => !document.querySelector('.message.streaming')")


def abort_count(server: ServerProcess) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    return metric_value(text, "pagode:request_success_total", {"finished_reason": "abort"})


def screenshot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        page.screenshot(path=str(Path(SCREENSHOTS) / name))


def test_no_ui_turns_the_page_off_and_the_page_forbids_inline_script() -> None:
    """Without a model load: the app's routes, built with and without --no-ui."""
    config = EngineConfig(quantization="none")
    with_ui = TestClient(create_app(ServerSettings(), engine_config=config))
    page = with_ui.get("/")
    assert page.status_code == 200 and "<script src=\"/ui/app.js\"" in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert with_ui.get("/ui/app.js").headers["content-type"].startswith("text/javascript")
    assert with_ui.get("/ui/..%2Fpages.py").status_code == 404  # only the listed files
    assert "<script>" not in page.text  # every script is a file: src=, defer
    assert not re.search(r"<[^>]*\son\w+\s*=", page.text, re.IGNORECASE)  # no inline handler
    assert with_ui.get("/ui/config.json").json() == {"auth": False, "model": "default"}
    without = TestClient(create_app(ServerSettings(no_ui=True), engine_config=config))
    assert without.get("/").status_code == 404
    assert without.get("/ui/app.js").status_code == 404


def read_stats_events(base_url: str, count: int, headers: dict[str, str] | None = None
                      ) -> list[tuple[str, dict[str, Any]]]:
    """The first `count` events of /stats/stream, parsed."""
    events: list[tuple[str, dict[str, Any]]] = []
    with httpx.stream("GET", base_url + "/stats/stream", headers=headers, timeout=60) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"].startswith("text/event-stream")
        name = ""
        for line in reply.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
                if len(events) == count:
                    break
    return events


def test_the_stats_stream_sends_a_snapshot_then_deltas(server: ServerProcess) -> None:
    (first, snapshot), (second, delta), (_, later) = read_stats_events(server.base_url, 3)
    assert first == "snapshot" and snapshot["type"] == "snapshot"
    assert snapshot["interval_s"] == 1.0 and snapshot["coarse_interval_s"] == 60.0
    assert {"ttft_p50", "waiting", "kv_usage", "preemptions"} <= set(snapshot["series"])
    assert len(snapshot["fine"]) <= 600 and len(snapshot["coarse"]) <= 1440
    assert [s["name"] for s in snapshot["signals"]] == ["ttft", "queue", "stream_speed",
                                                        "preemptions"]
    assert second == "delta" and delta["type"] == "delta"
    # Each delta holds the points that are new since the event before: one per second.
    assert len(delta["fine"]) >= 1 and len(later["fine"]) >= 1
    assert set(delta["fine"][-1]) == {"t", *snapshot["series"]}
    assert later["fine"][0]["t"] > delta["fine"][-1]["t"]
    if snapshot["fine"]:
        assert delta["fine"][0]["t"] > snapshot["fine"][-1]["t"]


@needs_chromium
def test_the_page_loads_with_no_console_error_and_no_failed_request(
        page_on: tuple[Any, PageWatch], server: ServerProcess) -> None:
    page, watch = page_on
    wait_live(page, min_points=2)
    page.click("#tab-live")
    page.wait_for_selector("#signal-queue")
    assert watch.console_errors == [] and watch.page_errors == [] and watch.failed == []
    assert all(r.url.startswith(server.base_url) for r in watch.requests), \
        [r.url for r in watch.requests]  # nothing from a CDN
    assert page.eval_on_selector_all(".chart svg", "svgs => svgs.length") == 8


@needs_chromium
def test_a_reply_streams_into_the_page_in_several_visible_steps(
        page_on: tuple[Any, PageWatch]) -> None:
    page, watch = page_on
    # Record every text the reply shows, as the DOM changes (not by polling).
    page.evaluate("""() => {
        window.seen = [];
        new MutationObserver(() => {
            const reply = document.querySelector('.message.assistant .content');
            if (reply && reply.textContent && window.seen.at(-1) !== reply.textContent)
                window.seen.push(reply.textContent);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true,
                                                        characterData: true});
    }""")
    page.check("#show-json")
    page.fill("#temperature", "0")
    send_prompt(page, "Write three sentences about the sea.", max_tokens=48)
    wait_reply_done(page)
    seen = page.evaluate("window.seen")
    assert len(seen) >= 3, seen
    assert len(seen[0]) < len(seen[-1])  # grew, rather than one text replaced by another
    stats = page.text_content(".message.assistant .reply-stats") or ""
    assert "TTFT" in stats and "tok/s" in stats and "tokens" in stats, stats
    request = json.loads(page.text_content("#request-json") or "{}")
    assert request["stream"] is True and request["temperature"] == 0 and request["max_tokens"] == 48
    saved = json.loads(page.evaluate("localStorage.getItem('pagode.conversations')"))
    assert [m["role"] for m in saved[0]["messages"]] == ["user", "assistant"]
    assert saved[0]["messages"][1]["content"] == seen[-1]
    screenshot(page, "ui-chat.png")
    # A reload shows the conversation again, from localStorage.
    page.reload()
    page.wait_for_selector(".message.assistant")
    assert page.text_content(".message.user .content") == "Write three sentences about the sea."
    assert watch.page_errors == []


@needs_chromium
def test_stop_closes_the_stream_and_the_server_aborts_the_request(
        page_on: tuple[Any, PageWatch], server: ServerProcess) -> None:
    page, watch = page_on
    before = abort_count(server)
    send_prompt(page, "Tell me a very long story about a lighthouse keeper.", max_tokens=900)
    page.wait_for_function(
        "() => (document.querySelector('.message.assistant .content')?.textContent || '')"
        ".length > 0")
    page.click("#stop")
    wait_reply_done(page)
    assert "stopped" in (page.text_content(".message.assistant .reply-stats") or "")
    deadline = time.monotonic() + WAIT_MS / 1000
    while abort_count(server) <= before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert abort_count(server) == before + 1
    assert watch.page_errors == [] and watch.console_errors == []


def burst(base_url: str, count: int) -> list[int]:
    """`count` long-prompt completions at once, from threads; their status codes."""
    statuses: list[int] = []

    def one(i: int) -> None:
        body = {"prompt": f"{i} " + "the quick brown fox jumps over the lazy dog " * 30,
                "max_tokens": 24, "ignore_eos": True, "temperature": 0}
        statuses.append(httpx.post(base_url + "/v1/completions", json=body,
                                   timeout=WAIT_MS / 1000).status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


@needs_chromium
def test_a_burst_of_requests_moves_the_live_view_and_its_queue_signal(
        page_on: tuple[Any, PageWatch], server: ServerProcess) -> None:
    page, watch = page_on
    wait_live(page)
    page.click("#tab-live")
    start = int(time.time())
    statuses: list[int] = []
    load = threading.Thread(target=lambda: statuses.extend(burst(server.base_url, 16)))
    load.start()
    moved = f"pagode.live.fine.filter(p => p.t >= {start})"  # the points since the burst began
    try:
        # While the burst runs, the page draws the queue and the batch it fills.
        page.wait_for_function(f"() => {moved}.some(p => p.waiting > 0) && "
                               f"{moved}.some(p => p.running > 0)")
    finally:
        load.join()
    assert statuses == [200] * 16
    # Every request of the burst is in the points once the page has the one after its end.
    page.wait_for_function(f"() => {moved}.reduce((n, p) => n + p.requests, 0) >= 16")
    assert page.evaluate(f"{moved}.some(p => p.ttft_p50 !== null)")
    chart = page.locator("#chart-requests")
    assert float(chart.get_attribute("data-waiting-max") or 0) > 0
    assert float(chart.get_attribute("data-running-max") or 0) > 0
    waiting_line = page.locator("#chart-requests path.s1").get_attribute("d") or ""
    assert "L" in waiting_line  # drawn as a line through several points
    assert page.get_attribute("#signal-queue", "data-state") in {"burst", "absorbed", "capacity"}
    assert float(page.locator("#chart-tokens").get_attribute("data-out-tok-s-max") or 0) > 0
    screenshot(page, "ui-live.png")  # the burst drawn whole
    assert watch.page_errors == [] and watch.console_errors == []


XSS = '<img src=x onerror="window.pwned=1"> and <script>window.pwned=2</script>'


@needs_chromium
def test_model_output_with_html_renders_as_text(page_on: tuple[Any, PageWatch]) -> None:
    """The 135M model does not echo a payload reliably, so the reply is forced: Playwright
    answers the page's /v1/chat/completions with an SSE body whose deltas hold the payload
    (split across chunks, as a model would stream it), reasoning, Markdown and a code block.
    The page's own fetch, SSE parsing and rendering handle it; the user's message holds the
    payload too."""
    page, watch = page_on
    pieces = ["<think>the user wants ", "HTML</think>Here: **bold** <img src=x ",
              'onerror="window.pwned=1">\n\n- one\n- `<b>two</b>`\n\n```html\n', XSS, "\n```\n"]
    chunks = [{"choices": [{"index": 0, "delta": {"content": piece}}]} for piece in pieces]
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"}, body=body))
    send_prompt(page, XSS)
    wait_reply_done(page)
    messages = page.locator("#messages")
    assert messages.locator("img").count() == 0 and messages.locator("script").count() == 0
    reply = page.locator(".message.assistant .content")
    assert 'onerror="window.pwned=1"' in (reply.text_content() or "")
    assert page.text_content(".message.user .content") == XSS
    assert reply.locator("strong").text_content() == "bold"
    assert reply.locator("li code").text_content() == "<b>two</b>"
    assert reply.locator("pre.code").text_content() == XSS + "\n"
    thought = reply.locator("details.think")
    assert thought.get_attribute("open") is None and "the user wants HTML" in (
        thought.text_content() or "")
    assert page.evaluate("window.pwned") is None
    assert watch.page_errors == [] and watch.console_errors == []


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if CHROMIUM is None:
        pytest.skip("no system Chromium")
    with running_server([*SMALL_ARGS, "--api-key", API_KEY],
                        tmp_path_factory.mktemp("ui-keyed"), name="ui-keyed") as proc:
        yield proc


@needs_chromium
def test_with_an_api_key_the_page_asks_for_it_fails_cleanly_without_and_works_with_it(
        browser: Any, keyed_server: ServerProcess) -> None:
    page, watch = open_page(browser, keyed_server.base_url)
    try:
        page.wait_for_selector("#key-box:not([hidden])")
        # Keyless, the page learns only that a key is needed: not even the model's name.
        assert httpx.get(keyed_server.base_url + "/ui/config.json", timeout=30).json() == {
            "auth": True, "model": None}
        assert "API key" in (page.text_content("#auth-note") or "")
        assert "API key" in (page.text_content("#live-status") or "")
        # Without the key: the server refuses, the page says why and stays usable.
        send_prompt(page, "Hello", max_tokens=8)
        page.wait_for_selector("#error:not([hidden])")
        assert "API key" in (page.text_content("#error") or "")
        assert page.locator(".message.assistant").count() == 0
        assert not page.is_disabled("#send") and page.is_disabled("#stop")
        assert not any("/stats/stream" in r.url for r in watch.requests)  # not asked keyless
        assert watch.page_errors == []
        # With the key: the live view connects and the chat answers.
        page.fill("#api-key", API_KEY)
        page.dispatch_event("#api-key", "change")
        wait_live(page)
        assert page.text_content("#model-name") == "SmolLM2-135M-Instruct"
        send_prompt(page, "Hello", max_tokens=8)
        wait_reply_done(page)
        assert (page.text_content(".message.assistant .content") or "").strip()
        assert page.is_hidden("#error")
        sent = [r for r in watch.requests if "/v1/chat/completions" in r.url]
        assert sent[-1].headers.get("authorization") == f"Bearer {API_KEY}"
        assert not any(API_KEY in r.url for r in watch.requests)  # never in a URL
        assert watch.page_errors == []
        # The stats stream obeys the key like the API.
        assert httpx.get(keyed_server.base_url + "/stats/stream", timeout=30).status_code == 401
        ((kind, _),) = read_stats_events(keyed_server.base_url, 1,
                                         {"Authorization": f"Bearer {API_KEY}"})
        assert kind == "snapshot"
    finally:
        page.context.close()


@pytest.fixture(scope="module")
def adapter_server(tiny_zoo: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A tiny Llama serving two random PEFT adapters beside the base."""
    if CHROMIUM is None:
        pytest.skip("no system Chromium")
    from lora_adapters import save_random_adapter
    from tiny_models import tiny_spec

    base = tiny_zoo.folder(tiny_spec("llama", "LlamaConfig", "LlamaForCausalLM", "llama"))
    root = tmp_path_factory.mktemp("ui-lora")
    for name, rank, seed in (("a", 8, 11), ("b", 16, 12)):
        save_random_adapter(base, root / name, rank, seed)
    args = ["--model", str(base), "--served-model-name", "tiny", "--quantization", "none", "--kv-cache-memory",
            "32MiB", "--max-model-len", "512", "--lora-modules", f"a={root / 'a'}", "--lora-modules",
            f"b={root / 'b'}", "--max-loras", "2"]
    with running_server(args, root, name="ui-lora") as proc:
        yield proc


@needs_chromium
def test_the_page_chats_with_the_model_or_adapter_picked(browser: Any, adapter_server: ServerProcess) -> None:
    """The model picker lists /v1/models (the base, and each adapter as one of it), starts on
    the default model, and the chat runs on what is picked: the page's reply on adapter b is
    the API's reply on b to the same request, not the base's."""
    page, watch = open_page(browser, adapter_server.base_url)
    try:
        page.wait_for_function("() => document.querySelectorAll('#model-pick option').length === 3")
        options = page.eval_on_selector_all("#model-pick option", "els => els.map(e => [e.value, e.textContent])")
        assert options[0] == ["tiny", "tiny"]
        assert sorted(options[1:]) == [["a", "a (adapter of tiny)"], ["b", "b (adapter of tiny)"]]
        assert page.input_value("#model-pick") == "tiny"
        page.select_option("#model-pick", "b")
        page.check("#show-json")
        page.fill("#temperature", "0")
        send_prompt(page, "w5 w17 w42 w9", max_tokens=12)
        wait_reply_done(page)
        request = json.loads(page.text_content("#request-json") or "{}")
        assert request["model"] == "b"
        shown = (page.text_content(".message.assistant .content") or "").split()

        def reply(model: str) -> list[str]:
            body = {k: v for k, v in request.items() if k not in ("stream", "stream_options")}
            done = httpx.post(adapter_server.base_url + "/v1/chat/completions", json={**body, "model": model},
                              timeout=120)
            assert done.status_code == 200, done.text
            assert done.json()["model"] == model
            return str(done.json()["choices"][0]["message"]["content"]).split()

        assert shown and shown == reply("b")
        assert shown != reply("tiny")
        # What a user would see go wrong: an uncaught error, the page's error line, an error status
        # or a request that failed. Chromium may report the streamed chat's fetch as aborted after
        # the page has read it whole (the reply above equals the API's), so that one alone is
        # not a failure here, as in the other chat tests.
        assert watch.page_errors == [] and page.is_hidden("#error")
        chat = adapter_server.base_url + "/v1/chat/completions: net::ERR_ABORTED"
        assert [f for f in watch.failed if f != chat] == []
    finally:
        page.context.close()
