"""A Hugging Face hub on the loopback, for the real `huggingface_hub` client (HF_ENDPOINT).

No hub mirror on PyPI serves local files offline with what the client relies on: olah's
local mirrors need git repos with LFS objects, answer HEAD without X-Repo-Commit or the
size, and ignore Range, so neither a resumed download nor a gated repo could be shown on
it. This server speaks the hub's documented routes over files on disk:

- `GET /api/models/{repo}` and `/api/models/{repo}/revision/{rev}`: the repo's info (`sha`,
  `siblings`, `gated`);
- `GET /api/models/{repo}/tree/{rev}`: the file listing (`oid`, `size`, `lfs`);
- `HEAD`/`GET /{repo}/resolve/{rev}/{path}`: the file, with `ETag`, `X-Repo-Commit`,
  `Content-Length`, `Accept-Ranges`, and a `206` for a Range request;

with the hub's errors as the client reads them (`X-Error-Code` RepoNotFound, GatedRepo,
RevisionNotFound, EntryNotFound; 401 without a token, 403 with one that has no access).
Every request is logged, and GETs of files can be slowed down, so a test can kill a
download half way and see the next one resume.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

CHUNK = 64 * 1024


@dataclass
class Revision:
    files: dict[str, Path]  # path in the repo -> file on disk
    sizes: dict[str, int] = field(default_factory=dict)  # what the listing claims, where not the file's size

    @property
    def commit(self) -> str:
        digest = hashlib.sha1()
        for path in sorted(self.files):
            digest.update(path.encode() + etag(self.files[path]).encode())
        return digest.hexdigest()


@dataclass
class Repo:
    revisions: dict[str, Revision]  # branch name -> revision
    gated_token: str | None = None  # set: a gated repo whose files only this token reads

    def find(self, rev: str) -> Revision | None:
        return self.revisions.get(rev) or next((r for r in self.revisions.values() if r.commit == rev), None)


@dataclass(frozen=True)
class Logged:
    method: str
    path: str
    range: str | None
    authorization: str | None


def etag(path: Path) -> str:
    """The sha256 of the file, as the hub tags LFS files."""
    return _digest(path, path.stat().st_mtime_ns, path.stat().st_size)


_DIGESTS: dict[tuple[Path, int, int], str] = {}


def _digest(path: Path, mtime: int, size: int) -> str:
    key = (path, mtime, size)
    if key not in _DIGESTS:
        _DIGESTS[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _DIGESTS[key]


class LocalHub:
    """The hub's routes over `repos`, on a free loopback port while started."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.log: list[Logged] = []
        self.bytes_per_second: float | None = None  # slow file GETs down (None: full speed)
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, repo_id: str, files: dict[str, Path], gated_token: str | None = None,
            branches: dict[str, dict[str, Path]] | None = None) -> Repo:
        revisions = {"main": Revision(files)}
        revisions.update({name: Revision(more) for name, more in (branches or {}).items()})
        self.repos[repo_id] = Repo(revisions, gated_token)
        return self.repos[repo_id]

    def start(self) -> LocalHub:
        hub = self

        class Handler(HubHandler):
            owner = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="local-hub").start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def gets(self, fragment: str) -> list[Logged]:
        """The file GETs whose path holds `fragment`."""
        return [e for e in self.log if e.method == "GET" and "/resolve/" in e.path and fragment in e.path]


class HubHandler(BaseHTTPRequestHandler):
    owner: LocalHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # the test reads self.owner.log instead

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.route(send_body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self.route(send_body=False)

    def route(self, send_body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.owner.log.append(Logged(self.command, path, self.headers.get("Range"),
                                     self.headers.get("Authorization")))
        try:
            if path.startswith("/api/models/"):
                self.api(path.removeprefix("/api/models/"))
            elif "/resolve/" in path:
                self.resolve(path.lstrip("/"), send_body)
            else:
                self.error(404, "", "Not found")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (a killed download)

    # ---- the API ----

    def api(self, rest: str) -> None:
        parts = rest.split("/")
        repo_id, tail = "/".join(parts[:2]), parts[2:]
        repo = self.owner.repos.get(repo_id)
        if repo is None:
            return self.error(401, "RepoNotFound", "Repository not found")
        rev_name = tail[1] if len(tail) >= 2 and tail[0] in ("revision", "tree") else "main"
        revision = repo.find(rev_name)
        if revision is None:
            return self.error(404, "RevisionNotFound", f"Invalid rev id: {rev_name}")
        if tail and tail[0] == "tree":
            return self.json([self.tree_entry(revision, name) for name in sorted(revision.files)])
        self.json({"_id": repo_id, "id": repo_id, "modelId": repo_id, "sha": revision.commit, "private": False,
                   "gated": "manual" if repo.gated_token else False, "disabled": False, "tags": [],
                   "downloads": 0, "likes": 0, "lastModified": "2026-12-01T00:00:00.000Z",
                   "siblings": [{"rfilename": name} for name in sorted(revision.files)]})

    def tree_entry(self, revision: Revision, name: str) -> dict[str, object]:
        file = revision.files[name]
        size = revision.sizes.get(name, file.stat().st_size)
        return {"type": "file", "path": name, "size": size, "oid": hashlib.sha1(name.encode()).hexdigest(),
                "lfs": {"oid": etag(file), "size": size, "pointerSize": 134}}

    # ---- files ----

    def resolve(self, rest: str, send_body: bool) -> None:
        head, _, tail = rest.partition("/resolve/")
        repo = self.owner.repos.get(head)
        if repo is None:
            return self.error(401, "RepoNotFound", "Repository not found")
        rev_name, _, name = tail.partition("/")
        revision = repo.find(rev_name)
        if revision is None:
            return self.error(404, "RevisionNotFound", f"Invalid rev id: {rev_name}")
        if repo.gated_token is not None and self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
            if self.headers.get("Authorization") is None:
                return self.error(401, "GatedRepo", f"Access to model {head} is restricted. You must have access "
                                  "to it and be authenticated to access it. Please log in.")
            return self.error(403, "GatedRepo", f"Access to model {head} is restricted and you are not in the "
                              "authorized list.")
        if name not in revision.files:
            return self.error(404, "EntryNotFound", f"{name} does not exist on {rev_name}")
        self.send_file(revision.files[name], revision.commit, send_body)

    def send_file(self, file: Path, commit: str, send_body: bool) -> None:
        size = file.stat().st_size
        start, end = self.byte_range(size)
        self.send_response(206 if (start, end) != (0, size) else 200)
        self.send_header("ETag", f'"{etag(file)}"')
        self.send_header("X-Repo-Commit", commit)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if (start, end) != (0, size):
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if send_body:
            self.stream(file, start, end)

    def byte_range(self, size: int) -> tuple[int, int]:
        """[start, end) of a `Range: bytes=N-` or `bytes=N-M` request; the whole file otherwise."""
        text = self.headers.get("Range")
        if not text or not text.startswith("bytes="):
            return 0, size
        first, _, last = text.removeprefix("bytes=").partition("-")
        start = int(first) if first else max(size - int(last), 0)
        end = int(last) + 1 if first and last else size
        return min(start, size), min(end, size)

    def stream(self, file: Path, start: int, end: int) -> None:
        with open(file, "rb") as f:
            f.seek(start)
            left = end - start
            while left > 0:
                chunk = f.read(min(CHUNK, left))
                self.wfile.write(chunk)
                left -= len(chunk)
                rate = self.owner.bytes_per_second
                if rate:
                    time.sleep(len(chunk) / rate)

    # ---- replies ----

    def json(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status: int, code: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
