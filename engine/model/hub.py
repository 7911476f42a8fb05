"""Fetch a model named on the Hugging Face hub into the shared hub cache, through the hub's own
client (`huggingface_hub`), and return the local path the loader reads.

The client brings what users expect of `vllm serve ORG/REPO` or `llama-server -hf`: the
cache in `HF_HOME` (a model fetched by any tool is found there), `HF_ENDPOINT`, `HF_TOKEN`,
`HF_HUB_OFFLINE` and its tqdm progress bars. Each file is fetched into an `.incomplete` file
that a later run resumes after a kill (engine/model/hub_resume.py) and renamed into place
only when whole, so nothing reads a file before it is finished; every failure is turned
into one sentence that says what to do, before the loader is reached.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx2
from huggingface_hub import constants, snapshot_download, try_to_load_from_cache
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

from engine.model.hub_names import HubName, MissingQuant, folder_files, is_gguf_repo, parse_hub_name, pick_gguf
from engine.model.hub_resume import fetch_blobs

log = logging.getLogger("pagode")

# The hub cannot be reached: the cache may still hold the model.
_UNREACHABLE = (httpx2.TransportError, OfflineModeIsEnabled)
# What the listing retries: the client's own list less a connection never made (no network, a
# refused port, a name that does not resolve). The hub is then not there, and the cache answers
# at once, as hf_hub_download's own fall-back to the cache does, instead of after the client's
# 1 + 2 + 4 + 8 + 8 s of backoff.
_RETRIED = (httpx2.TimeoutException, httpx2.ReadError, httpx2.WriteError, httpx2.RemoteProtocolError)


class HubError(ValueError):
    """A model named on the hub cannot be had; the message says why and what to do."""


def is_hub_name(model: str | None) -> bool:
    """A name to fetch: not an existing local path, and shaped as ORG/REPO[:QUANT]."""
    return model is not None and not Path(model).expanduser().exists() and parse_hub_name(model) is not None


def fetch(model: str, revision: str | None = None) -> Path:
    """The local path of hub model `model` (a folder, or a GGUF's first part), downloaded into
    the hub cache unless it is there already."""
    name = parse_hub_name(model)
    if name is None:
        raise HubError(f"{model!r} is neither a local path nor a hub name (ORG/REPO or ORG/REPO:QUANT)")
    with _explained(name, revision):
        try:
            listing = _list_files(name, revision)
        except _UNREACHABLE as err:
            return _from_cache(name, revision, err)
        wanted = _choose(name, list(listing))
        _check_disk(name, revision, {f: listing[f] for f in wanted})
        fetch_blobs(name.repo, revision, wanted)
        folder = snapshot_download(name.repo, revision=revision, allow_patterns=wanted)
        return _local_path(Path(folder), name, wanted)
    raise AssertionError("unreachable")  # _explained re-raises every error it catches


def _list_files(name: HubName, revision: str | None) -> dict[str, int]:
    """Every file of the repo at `revision`, with its size in bytes: the tree listing that
    HfApi.list_repo_tree reads, page by page, with the retries of _RETRIED."""
    rev = quote(revision, safe="") if revision is not None else constants.DEFAULT_REVISION
    url: str | None = f"{constants.ENDPOINT}/api/models/{name.repo}/tree/{rev}"
    params: dict[str, bool] | None = {"recursive": True, "expand": False}
    headers = build_hf_headers()
    files: dict[str, int] = {}
    while url is not None:
        response = http_backoff("GET", url, params=params, headers=headers, retry_on_exceptions=_RETRIED)
        hf_raise_for_status(response)
        files.update({e["path"]: e["size"] for e in response.json() if e["type"] == "file"})
        url, params = response.links.get("next", {}).get("url"), None  # the next page's link holds its query
    return files


def _choose(name: HubName, files: list[str]) -> list[str]:
    """The files that serving `name` needs: one GGUF (all its parts), or a folder's config,
    weights and tokenizer."""
    if is_gguf_repo(name, files):
        return pick_gguf(files, name.quant)
    wanted = folder_files(files)
    if "config.json" not in wanted or not any(f.endswith(".safetensors") for f in wanted):
        raise HubError(f"{name.repo} holds no config.json with *.safetensors weights, nor a .gguf file; "
                       f"its files: {', '.join(sorted(files)[:20])}")
    return wanted


def _from_cache(name: HubName, revision: str | None, cause: BaseException) -> Path:
    """The model from the hub cache when the hub cannot be reached (HF_HUB_OFFLINE, no
    network): the files already fetched, checked whole by the client."""
    snapshot = _cached_snapshot(name, revision)
    if snapshot is None:
        raise HubError(f"cannot reach the hub at {constants.ENDPOINT} ({_reason(cause)}) and {name} is not in "
                       f"the hub cache {constants.HF_HUB_CACHE}: connect to the network (or unset "
                       f"HF_HUB_OFFLINE) to download it, or pass a local path") from cause
    files = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
    wanted = _choose(name, files)
    folder = snapshot_download(name.repo, revision=revision, allow_patterns=wanted, local_files_only=True)
    log.info("%s: the hub is not reachable (%s); serving the copy in the hub cache", name, _reason(cause))
    return _local_path(Path(folder), name, wanted)


def _cached_snapshot(name: HubName, revision: str | None) -> Path | None:
    """The cache's snapshot folder of `revision` (a branch or tag through its ref, or a commit),
    in the layout the client writes: models--ORG--NAME/{refs,snapshots}."""
    storage = Path(constants.HF_HUB_CACHE) / f"models--{name.repo.replace('/', '--')}"
    commit = revision or constants.DEFAULT_REVISION
    ref = storage / "refs" / commit
    if ref.is_file():
        commit = ref.read_text().strip()
    snapshot = storage / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _local_path(folder: Path, name: HubName, wanted: list[str]) -> Path:
    if wanted[0].endswith(".gguf"):
        return folder / wanted[0]
    return folder


def _check_disk(name: HubName, revision: str | None, sizes: dict[str, int]) -> None:
    """Refuse before downloading when the files still to fetch do not fit the cache's disk:
    otherwise the client would fill it and fail part way."""
    needed = sum(size for path, size in sizes.items()
                 if not isinstance(try_to_load_from_cache(name.repo, path, revision=revision), str))
    cache = Path(constants.HF_HUB_CACHE)
    probe = next(p for p in (cache, *cache.parents) if p.exists())
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise HubError(f"not enough disk space for {name}: it needs {_size(needed)}, {_size(free)} are free at "
                       f"{probe} (the hub cache {cache}; HF_HOME or HF_HUB_CACHE move it)")


@contextlib.contextmanager
def _explained(name: HubName, revision: str | None) -> Iterator[None]:
    """The client's errors as one sentence each, saying what to do."""
    at = f" at revision {revision!r}" if revision else ""
    try:
        yield
    except GatedRepoError as err:
        status = err.response.status_code if err.response is not None else "401/403"
        token = "the token in HF_TOKEN has no access" if os.environ.get("HF_TOKEN") else "no HF_TOKEN is set"
        raise HubError(f"{name.repo} is a gated repo (HTTP {status}: {token}): accept its conditions on its hub "
                       f"page, then set HF_TOKEN to a token of that account") from err
    except RevisionNotFoundError as err:
        raise HubError(f"{name.repo} has no revision {revision!r} (a branch, tag or commit)") from err
    except RepositoryNotFoundError as err:
        raise HubError(f"{name.repo} is no local path, and no repo on the hub at {constants.ENDPOINT} (if it is "
                       f"private, set HF_TOKEN to a token with access)") from err
    except MissingQuant as err:
        raise HubError(f"{name.repo}{at}: {err}") from err
    except LocalEntryNotFoundError as err:
        raise HubError(f"{name}{at} is not whole in the hub cache {constants.HF_HUB_CACHE} and the hub cannot be "
                       f"reached: connect to the network (or unset HF_HUB_OFFLINE) to finish it") from err
    except _UNREACHABLE as err:
        raise HubError(f"the download of {name} from {constants.ENDPOINT} failed ({_reason(err)}); run the "
                       f"same command again to resume it") from err
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        raise HubError(f"the disk filled while downloading {name} into {constants.HF_HUB_CACHE}: free space "
                       f"(or move the cache with HF_HOME) and run the same command again to resume") from err
    except HfHubHTTPError as err:
        raise HubError(f"the hub refused {name}{at}: {_reason(err)}") from err


def _reason(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.1f} {unit}"
