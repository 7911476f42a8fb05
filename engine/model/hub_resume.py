"""Downloads from the hub that survive a kill: each file's bytes go to `blobs/{etag}.incomplete`
in the hub cache and a later run asks for the rest with a Range request.

huggingface_hub (since 1.x) downloads into a temporary file unique to the process and deletes
it when the process fails, so a model of gigabytes killed at 90% starts again from zero.
Here the client's own pieces do the transfer (`get_hf_file_metadata` for the ETag and size,
`http_get` with `resume_size` for the Range request and its tqdm bar, with bytes and rate);
the finished file is checked against the hub's sha256 and renamed to the blob the client
itself would write, so the `snapshot_download` that follows finds it there and only links it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.file_download import http_get, repo_folder_name
from huggingface_hub.utils import build_hf_headers

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def fetch_blobs(repo: str, revision: str | None, files: list[str]) -> None:
    """Put each file's blob in the hub cache, resuming what an earlier run left."""
    folder = repo_folder_name(repo_id=repo, repo_type="model")
    blobs = Path(constants.HF_HUB_CACHE) / folder / "blobs"
    locks = Path(constants.HF_HUB_CACHE) / ".locks" / folder
    for name in files:
        meta = get_hf_file_metadata(hf_hub_url(repo, name, revision=revision))
        if meta.etag is None:
            continue  # nothing to name the blob by: the client's own download handles it
        blob = blobs / meta.etag
        if blob.exists():
            continue
        blobs.mkdir(parents=True, exist_ok=True)
        locks.mkdir(parents=True, exist_ok=True)
        with _locked(locks / f"{meta.etag}.lock"):
            if not blob.exists():
                _download(meta.location, blob, meta.size, name)


def _download(url: str, blob: Path, size: int | None, name: str) -> None:
    partial = blob.with_name(blob.name + ".incomplete")
    with open(partial, "ab") as out:
        http_get(url, out, resume_size=out.tell(), headers=build_hf_headers(), expected_size=size,
                 displayed_filename=name)
    if _SHA256.match(blob.name) and _sha256(partial) != blob.name:
        partial.unlink()  # a resumed file that does not hash right must not be resumed again
        raise OSError(f"{name}: the downloaded bytes do not match the hub's sha256; run again to download anew")
    partial.replace(blob)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One writer per blob: two pulls of one model would otherwise append to one file. The lock
    is the file the client locks for the same blob (its filelock is flock on Unix), so a
    client download of that blob waits too."""
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
