"""Several models in one server: `--model` given three times, at most two loaded at once.

One server, real HTTP, the real `openai` SDK. A stream on the default model (tiny Llama) is
held running (tests/gated_engine.py stalls that model's steps while a gate file exists)
while a tiny Qwen2 loads on demand and then a third model is asked for: the least recently
used model is the Llama, but it has a request running, so the Qwen2 is unloaded instead.
The stream then finishes with transformers' greedy tokens, as do the others.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from reference import reference_greedy
from server_fixtures import ServerProcess, running_server
from tiny_models import save_tiny_model

PROMPT = [5, 17, 42, 8, 99, 3, 150, 64]
STREAM_TOKENS = 48
NEW_TOKENS = 16
NAMES = ("llama", "qwen2", "llama-tied")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    for name, arch, tie in (("llama", "llama", False), ("qwen2", "qwen2", False), ("llama-tied", "llama", True)):
        save_tiny_model(root / f"gated-{name}" if name == "llama" else root / name, arch=arch, tie=tie)
    return {"llama": root / "gated-llama", "qwen2": root / "qwen2", "llama-tied": root / "llama-tied"}


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate") / "closed"


@pytest.fixture(scope="module")
def server(folders: dict[str, Path], gate: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = [arg for name in NAMES for arg in ("--model", str(folders[name]), "--served-model-name", name)]
    args += ["--max-loaded-models", "2", "--quantization", "none", "--kv-cache-dtype", "fp32",
             "--kv-cache-memory", "32MiB", "--max-model-len", "256", "--max-num-seqs", "4",
             "--engine-factory", "tests.gated_engine:GatedEngine"]
    env = {"PAGODE_TEST_GATE": str(gate), "PAGODE_TEST_GATED": "gated-llama"}
    with running_server(args, tmp_path_factory.mktemp("logs"), env=env) as started:
        yield started


def reference(folder: Path, new_tokens: int) -> list[str]:
    """transformers' greedy continuation of PROMPT, as words (the tiny tokenizer's tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ids = reference_greedy(model, PROMPT, new_tokens, None)
    return list(AutoTokenizer.from_pretrained(str(folder)).convert_ids_to_tokens(ids))


def loaded(http: httpx.Client) -> dict[str, bool]:
    return {card["id"]: card["loaded"] for card in http.get("/v1/models").json()["data"]}


def complete(client: openai.OpenAI, model: str) -> list[str]:
    done = client.completions.create(model=model, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0,
                                     extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert done.model == model
    return words_of(done.choices[0].text)


def words_of(text: str) -> list[str]:
    """The tiny tokenizer's tokens (w0 ... w199 and its specials), which its decoder writes with
    no space between."""
    return re.findall(r"w\d+|<s>|</s>|<unk>", text)


def read_stream(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line.removeprefix("data: "))


def test_only_the_default_model_loads_at_start(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        assert loaded(http) == {"llama": True, "qwen2": False, "llama-tied": False}


def test_models_load_on_demand_lru_unloads_around_a_running_stream(server: ServerProcess, folders: dict[str, Path],
                                                                   gate: Path) -> None:
    client = openai.OpenAI(base_url=server.api_url, api_key="none", timeout=300)
    body = {"model": "llama", "prompt": PROMPT, "max_tokens": STREAM_TOKENS, "temperature": 0,
            "ignore_eos": True, "skip_special_tokens": False, "stream": True}
    with httpx.Client(base_url=server.base_url, timeout=300) as http, \
            http.stream("POST", "/v1/completions", json=body) as stream:
        events = read_stream(stream.iter_lines())
        words = words_of(next(events)["choices"][0]["text"])
        gate.touch()  # the Llama stream is running, and holds still from its next step
        try:
            assert complete(client, "qwen2") == reference(folders["qwen2"], NEW_TOKENS)  # loaded on demand
            assert loaded(http) == {"llama": True, "qwen2": True, "llama-tied": False}
            # Full: the least recently used model is the Llama, but its stream runs: Qwen2 goes.
            assert complete(client, "llama-tied") == reference(folders["llama-tied"], NEW_TOKENS)
            assert loaded(http) == {"llama": True, "qwen2": False, "llama-tied": True}
            refused = http.post("/models/unload", json={"model": "llama"})
            assert refused.status_code == 409 and "has requests running" in refused.json()["error"]["message"]
        finally:
            gate.unlink()
        words += [w for event in events for w in words_of(event["choices"][0]["text"])]
    assert words == reference(folders["llama"], STREAM_TOKENS)  # untouched by the loads beside it


def test_load_and_unload_routes(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=300) as http:
        for name in ("llama", "llama-tied"):
            if loaded(http)[name]:
                assert http.post("/models/unload", json={"model": name}).json() == {
                    "success": True, "model": name, "loaded": False}
        assert http.post("/models/load", json={"model": "qwen2"}).json()["loaded"] is True
        assert loaded(http) == {"llama": False, "qwen2": True, "llama-tied": False}
        missing = http.post("/models/load", json={"model": "gpt-4"})
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"


def test_each_model_has_its_metrics(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.api_url, api_key="none", timeout=300)
    for name in ("llama", "qwen2"):
        complete(client, name)
    text = httpx.get(f"{server.base_url}/metrics", timeout=60).text
    types = [line for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)) and "# TYPE pagode:generation_tokens_total counter" in types  # merged
    for name in ("llama", "qwen2"):
        series = f'pagode:generation_tokens_total{{model_name="{name}"}}'
        line = next(x for x in text.splitlines() if x.startswith(series))
        assert float(line.split()[-1]) >= NEW_TOKENS
        assert live_view_model(server, name) == name  # the live view's feed, per model
    assert httpx.get(f"{server.base_url}/stats/stream?model=gpt-4", timeout=60).status_code == 404


def live_view_model(server: ServerProcess, name: str) -> str:
    """The model the first event of /stats/stream?model=NAME is about."""
    with httpx.Client(base_url=server.base_url, timeout=60) as http, \
            http.stream("GET", "/stats/stream", params={"model": name}) as feed:
        data = next(line for line in feed.iter_lines() if line.startswith("data:"))
        return str(json.loads(data.removeprefix("data:"))["model"])


def test_an_unknown_model_is_openais_404(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.api_url, api_key="none", timeout=60)
    with pytest.raises(openai.NotFoundError) as raised:
        client.completions.create(model="gpt-4", prompt="w1", max_tokens=2)
    assert raised.value.body["message"] == "The model `gpt-4` does not exist."  # type: ignore[index]


def test_the_memory_budget_unloads_to_make_room(folders: dict[str, Path], tmp_path: Path) -> None:
    """A budget that holds one model's KV cache and weights, not two: asking for the second
    unloads the first (idle), and asking for the first again brings it back."""
    args = ["--model", str(folders["qwen2"]), "--served-model-name", "qwen2", "--model", str(folders["llama-tied"]),
            "--served-model-name", "llama-tied", "--models-memory", "48MiB", "--kv-cache-memory", "32MiB",
            "--quantization", "none", "--kv-cache-dtype", "fp32", "--max-model-len", "256", "--max-num-seqs", "4"]
    with running_server(args, tmp_path) as budgeted, httpx.Client(base_url=budgeted.base_url, timeout=300) as http:
        client = openai.OpenAI(base_url=budgeted.api_url, api_key="none", timeout=300)
        assert complete(client, "llama-tied") == reference(folders["llama-tied"], NEW_TOKENS)
        assert loaded(http) == {"qwen2": False, "llama-tied": True}
        assert complete(client, "qwen2") == reference(folders["qwen2"], NEW_TOKENS)
        assert loaded(http) == {"qwen2": True, "llama-tied": False}
        assert "unloading 'qwen2' (least recently used) to load 'llama-tied'" in budgeted.log()


def test_a_one_model_server_keeps_its_model(folders: dict[str, Path], tmp_path: Path) -> None:
    """One model: nothing routes requests to load it again, so unloading it is refused."""
    args = ["--model", str(folders["qwen2"]), "--served-model-name", "qwen2", "--max-model-len", "256",
            "--kv-cache-memory", "32MiB", "--max-num-seqs", "4"]
    with running_server(args, tmp_path) as one, httpx.Client(base_url=one.base_url, timeout=60) as http:
        refused = http.post("/models/unload", json={"model": "qwen2"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"
        assert http.post("/models/load", json={"model": "qwen2"}).json()["loaded"] is True
        assert loaded(http) == {"qwen2": True}
