"""Models named on the hub: `pagode pull` and `pagode serve ORG/REPO[:QUANT]` through the real
`huggingface_hub` client against a hub on the loopback (tests/hub_server.py, HF_ENDPOINT),
answered over HTTP by the real `openai` SDK.

The repos hold the project's tiny models: a safetensors folder beside files serving must not
fetch, and a GGUF repo written by llama.cpp's own converter (Q8_0, split in two parts) and
llama-quantize (Q4_K_M), beside an mmproj and an imatrix file the pick must skip.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from converter_files import SMOLLM_VOCAB, converter_folder, quantize, run_converter
from hub_server import LocalHub
from server_fixtures import REPO_ROOT, SMALL_ARGS, running_server
from tiny_models import TinyZoo, save_tiny_model, tiny_spec

from loadgen.server_process import free_port

# K-quants need rows that are multiples of 256; the converter wants a tokenizer it knows.
GGUF_SPEC = tiny_spec("hub-llama", "LlamaConfig", "LlamaForCausalLM", "llama", hidden_size=256,
                      intermediate_size=512, initializer_range=0.05, vocab_size=SMOLLM_VOCAB)
SERVE_ARGS = [*SMALL_ARGS, "--max-num-seqs", "4"]
FOLDER_NEEDS = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "chat_template.jinja"}
GATED_TOKEN = "hf_granted"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, tiny_zoo: TinyZoo) -> dict[str, Path]:
    """The files the repos hold: a tiny folder (and a variant for another branch), a split
    Q8_0 GGUF and a Q4_K_M one."""
    root = tmp_path_factory.mktemp("hub-models")
    save_tiny_model(root / "folder")
    save_tiny_model(root / "folder-v0", tie=True)
    (root / "junk").mkdir()
    for name in ("pytorch_model.bin", "model.onnx", "consolidated.safetensors"):
        (root / "junk" / name).write_bytes(os.urandom(4096))
    converted = split_q8_0(tiny_zoo, root / "gguf")
    files = {p.name: p for p in converted}
    files["hub-llama-Q4_K_M.gguf"] = quantize(tiny_zoo, GGUF_SPEC, "Q4_K_M")
    files["mmproj-hub-llama-Q8_0.gguf"] = root / "junk" / "model.onnx"
    files["hub-llama.imatrix.gguf"] = root / "junk" / "pytorch_model.bin"
    return {"root": root, **{f"gguf/{k}": v for k, v in files.items()}}


def split_q8_0(zoo: TinyZoo, into: Path) -> list[Path]:
    """llama.cpp's converter writing Q8_0 in parts of at most 12 tensors."""
    into.mkdir(parents=True, exist_ok=True)
    out = into / "hub-llama-Q8_0.gguf"
    run_converter([str(converter_folder(zoo, GGUF_SPEC)), "--outtype", "q8_0", "--outfile", str(out),
                   "--split-max-tensors", "12"])
    parts = sorted(into.glob("hub-llama-Q8_0-*-of-*.gguf"))
    assert len(parts) >= 2, f"the converter wrote {sorted(p.name for p in into.iterdir())}"
    return parts


def folder_files(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in folder.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def hub(models: dict[str, Path]) -> Iterator[LocalHub]:
    root = models["root"]
    hub = LocalHub()
    junk = {"pytorch_model.bin": root / "junk" / "pytorch_model.bin", "onnx/model.onnx": root / "junk" / "model.onnx",
            "consolidated.safetensors": root / "junk" / "consolidated.safetensors"}
    hub.add("org/tiny-llama", {**folder_files(root / "folder"), **junk},
            branches={"v0": folder_files(root / "folder-v0")})
    hub.add("org/tiny-llama-GGUF", {k.removeprefix("gguf/"): v for k, v in models.items() if k.startswith("gguf/")})
    hub.add("org/gated-llama", folder_files(root / "folder"), gated_token=GATED_TOKEN)
    huge = hub.add("org/huge-llama", folder_files(root / "folder"))
    huge.revisions["main"].sizes["model.safetensors"] = 2**50  # a pebibyte: no disk here holds it
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One hub cache for the module: what one test fetched, the next finds."""
    return tmp_path_factory.mktemp("hf-home")


def hub_env(endpoint: str, hf_home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**env, "HF_ENDPOINT": endpoint, "HF_HOME": str(hf_home), "HF_HUB_DISABLE_TELEMETRY": "1",
            "PYTHONUNBUFFERED": "1", **extra}


def pagode(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def pulled(done: subprocess.CompletedProcess[str]) -> Path:
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def answer(base_url: str, model: str) -> str:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none")
    assert [m.id for m in client.models.list().data] == [model]
    done = client.completions.create(model=model, prompt="one two three", max_tokens=8, temperature=0)
    assert done.usage is not None and done.usage.completion_tokens > 0
    return done.choices[0].text


def test_pull_fetches_only_what_a_folder_model_needs(hub: LocalHub, hf_home: Path, models: dict[str, Path]) -> None:
    # TQDM_POSITION=-1 is the client's switch that shows its bars off a terminal too
    done = pagode("pull", "org/tiny-llama", env=hub_env(hub.url, hf_home, TQDM_POSITION="-1"))
    path = pulled(done)
    assert path.parent.parent == hf_home / "hub" / "models--org--tiny-llama" and path.parent.name == "snapshots"
    assert {p.name for p in path.iterdir()} == FOLDER_NEEDS
    for name in FOLDER_NEEDS:
        assert digest(path / name) == digest(models["root"] / "folder" / name)
    fetched = {e.path.rsplit("/", 1)[-1] for e in hub.gets("org/tiny-llama/")}
    assert fetched == FOLDER_NEEDS  # never the .bin, the ONNX folder or the consolidated weights
    assert re.search(r"model\.safetensors: 100%.*\d[kMG]?B/s", done.stderr), done.stderr  # bytes and rate


def test_serve_a_folder_repo_by_name(hub: LocalHub, hf_home: Path, tmp_path: Path) -> None:
    with running_server(["org/tiny-llama", *SERVE_ARGS], tmp_path, env=hub_env(hub.url, hf_home)) as server:
        assert answer(server.base_url, "org/tiny-llama")


def test_revision_names_a_branch(hub: LocalHub, hf_home: Path) -> None:
    path = pulled(pagode("pull", "org/tiny-llama", "--revision", "v0", env=hub_env(hub.url, hf_home)))
    assert path.name == hub.repos["org/tiny-llama"].revisions["v0"].commit
    assert '"tie_word_embeddings": true' in (path / "config.json").read_text()


def test_gguf_quant_picked_as_llama_cpp_does(hub: LocalHub, hf_home: Path, models: dict[str, Path]) -> None:
    env = hub_env(hub.url, hf_home)
    split = pulled(pagode("pull", "org/tiny-llama-GGUF:Q8_0", env=env))
    parts = sorted(p.name for p in split.parent.glob("hub-llama-Q8_0-*"))
    assert split.name == parts[0] and split.name.endswith(f"-00001-of-{len(parts):05d}.gguf")
    for name in parts:
        assert digest(split.parent / name) == digest(models[f"gguf/{name}"])
    whole = pulled(pagode("pull", "org/tiny-llama-GGUF:q4_k_m", env=env))  # the tag is case-insensitive
    assert whole.name == "hub-llama-Q4_K_M.gguf"
    assert not hub.gets("mmproj") and not hub.gets("imatrix")


def test_serve_a_q4_k_m_gguf_by_name(hub: LocalHub, hf_home: Path, tmp_path: Path) -> None:
    with running_server(["org/tiny-llama-GGUF:Q4_K_M", *SERVE_ARGS], tmp_path,
                        env=hub_env(hub.url, hf_home)) as server:
        assert answer(server.base_url, "org/tiny-llama-GGUF:Q4_K_M")


def test_a_cached_split_gguf_serves_with_the_hub_gone(hub: LocalHub, hf_home: Path, tmp_path: Path) -> None:
    """Fetched once, then served with no hub at all: a closed port, then HF_HUB_OFFLINE."""
    pulled(pagode("pull", "org/tiny-llama-GGUF:Q8_0", env=hub_env(hub.url, hf_home)))
    gone = f"http://127.0.0.1:{free_port()}"
    asked = len(hub.log)
    with running_server(["org/tiny-llama-GGUF:Q8_0", *SERVE_ARGS], tmp_path, env=hub_env(gone, hf_home)) as server:
        assert answer(server.base_url, "org/tiny-llama-GGUF:Q8_0")
        assert "serving the copy in the hub cache" in server.log()
        assert "Retrying in" not in server.log()  # a refused connection is not waited on
    offline = pagode("pull", "org/tiny-llama-GGUF:Q8_0", env=hub_env(hub.url, hf_home, HF_HUB_OFFLINE="1"))
    assert pulled(offline).name.startswith("hub-llama-Q8_0-00001-of-")
    assert len(hub.log) == asked  # the live hub was never asked


def test_missing_quant_lists_the_quants_there_are(hub: LocalHub, hf_home: Path) -> None:
    done = pagode("pull", "org/tiny-llama-GGUF:Q5_K_S", env=hub_env(hub.url, hf_home))
    assert done.returncode == 1
    assert "no GGUF file for the quant 'Q5_K_S'; the repo has: Q4_K_M, Q8_0" in done.stderr, done.stderr


def test_gated_repo_says_what_to_do(hub: LocalHub, tmp_path: Path) -> None:
    anonymous = pagode("pull", "org/gated-llama", env=hub_env(hub.url, tmp_path))
    assert anonymous.returncode == 1
    assert "org/gated-llama is a gated repo (HTTP 401: no HF_TOKEN is set)" in anonymous.stderr, anonymous.stderr
    wrong = pagode("pull", "org/gated-llama", env=hub_env(hub.url, tmp_path, HF_TOKEN="hf_other"))
    assert "(HTTP 403: the token in HF_TOKEN has no access)" in wrong.stderr, wrong.stderr
    assert not list(tmp_path.rglob("model.safetensors"))  # nothing half there to be used
    granted = pulled(pagode("pull", "org/gated-llama", env=hub_env(hub.url, tmp_path, HF_TOKEN=GATED_TOKEN)))
    assert (granted / "model.safetensors").is_file()


def test_no_network_and_no_cache(tmp_path: Path) -> None:
    gone = f"http://127.0.0.1:{free_port()}"
    done = pagode("serve", "org/tiny-llama", env=hub_env(gone, tmp_path))
    assert done.returncode == 1
    assert f"cannot reach the hub at {gone}" in done.stderr and "is not in the hub cache" in done.stderr
    assert "Retrying in" not in done.stderr  # said at once, not after the client's backoff


def test_full_disk_refused_before_any_byte(hub: LocalHub, tmp_path: Path) -> None:
    done = pagode("pull", "org/huge-llama", env=hub_env(hub.url, tmp_path))
    assert done.returncode == 1
    assert "not enough disk space for org/huge-llama: it needs 1024.0 TiB" in done.stderr, done.stderr
    assert not hub.gets("org/huge-llama/")


def test_unknown_repo(hub: LocalHub, tmp_path: Path) -> None:
    done = pagode("pull", "org/nothing-here", env=hub_env(hub.url, tmp_path))
    assert done.returncode == 1 and "org/nothing-here is no local path, and no repo on the hub" in done.stderr


def test_a_killed_download_resumes(hub: LocalHub, tmp_path: Path, models: dict[str, Path]) -> None:
    """SIGKILL half way through the Q4_K_M file, then the same command: the client asks for
    the rest with a Range request and the file ends byte-identical."""
    env = hub_env(hub.url, tmp_path)
    source = models["gguf/hub-llama-Q4_K_M.gguf"]
    size = source.stat().st_size
    hub.bytes_per_second = size / 8  # eight seconds for the file
    try:
        proc = subprocess.Popen([sys.executable, "-m", "server.cli", "pull", "org/tiny-llama-GGUF:Q4_K_M"],
                                cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        partial = wait_for_partial(tmp_path, size // 4, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kept = partial.stat().st_size
        assert 0 < kept < size
    finally:
        hub.bytes_per_second = None
    path = pulled(pagode("pull", "org/tiny-llama-GGUF:Q4_K_M", env=env))
    assert digest(path) == digest(source)
    ranges = [e.range for e in hub.gets("hub-llama-Q4_K_M.gguf")]
    assert ranges[0] is None and ranges[-1] is not None
    resumed_from = int(ranges[-1].removeprefix("bytes=").split("-")[0])
    assert resumed_from == kept, ranges


def wait_for_partial(hf_home: Path, at_least: int, proc: subprocess.Popen[bytes]) -> Path:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        for found in hf_home.rglob("*.incomplete"):
            if found.stat().st_size >= at_least:
                return found
        time.sleep(0.05)
    raise TimeoutError("no partial download appeared")


def test_several_hub_models_in_one_server(hub: LocalHub, hf_home: Path, tmp_path: Path) -> None:
    """Each --model's hub name is fetched before the server starts and served under the
    name typed; the second loads when a request names it."""
    args = ["--model", "org/tiny-llama", "--model", "org/tiny-llama-GGUF:Q4_K_M", *SERVE_ARGS]
    with running_server(args, tmp_path, env=hub_env(hub.url, hf_home)) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none")
        cards = {m.id: m.model_extra["loaded"] for m in client.models.list().data}  # type: ignore[index]
        assert cards == {"org/tiny-llama": True, "org/tiny-llama-GGUF:Q4_K_M": False}
        for name in cards:
            done = client.completions.create(model=name, prompt="one two", max_tokens=4, temperature=0)
            assert done.model == name and done.usage is not None and done.usage.completion_tokens > 0


def plan_of(model_args: list[str], env: dict[str, str]) -> dict[str, object]:
    done = pagode("plan", *model_args, "--device", "cpu", "--kv-cache-memory", "64MiB", "--json", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    plan: dict[str, object] = json.loads(done.stdout)
    return plan


def test_plan_takes_a_hub_name_as_serve_does(hub: LocalHub, hf_home: Path, models: dict[str, Path]) -> None:
    """`pagode plan ORG/REPO[:QUANT]` resolves the name through the hub code serve uses: fetched
    into the hub cache (or found there), planned on the same weights as the local copy, then
    planned again with the hub gone, from the cache; an unknown repo is the hub's message."""
    env = hub_env(hub.url, hf_home)
    local = plan_of(["--model", str(models["root"] / "folder")], env)
    by_name = plan_of(["org/tiny-llama"], env)
    assert by_name["model"] == "org/tiny-llama"
    assert by_name["memory"] == local["memory"]
    gguf = plan_of(["--model", "org/tiny-llama-GGUF:Q4_K_M"], env)
    assert gguf["model"] == "org/tiny-llama-GGUF:Q4_K_M" and gguf["weights_dtype"] == by_name["weights_dtype"]
    asked = len(hub.log)
    gone = f"http://127.0.0.1:{free_port()}"
    assert plan_of(["org/tiny-llama"], hub_env(gone, hf_home))["memory"] == local["memory"]
    assert plan_of(["org/tiny-llama"], hub_env(hub.url, hf_home, HF_HUB_OFFLINE="1"))["memory"] == local["memory"]
    assert len(hub.log) == asked  # the live hub was never asked
    unknown = pagode("plan", "org/nothing-here", env=env)
    assert unknown.returncode == 1 and "org/nothing-here is no local path, and no repo on the hub" in unknown.stderr
