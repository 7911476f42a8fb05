"""Stored responses of the Responses API, for GET/DELETE /v1/responses/{id} and
`previous_response_id`: each response with its whole conversation (every input item before
it, then its output), in SQLite so that a conversation survives a restart, and bounded:
past `max_rows` the oldest are dropped, as a cache would.

Rows are small and writes rare next to generation, so the calls run on the event loop
behind one lock rather than in the worker pool.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

SCHEMA = """CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, created REAL NOT NULL, response TEXT NOT NULL,
    conversation TEXT NOT NULL)"""


class ResponseStore:
    def __init__(self, path: Path, max_rows: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_rows = max_rows
        self.lock = threading.Lock()
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(SCHEMA)

    def save(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        with self.lock:
            self.db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)",
                            (response["id"], time.time(), json.dumps(response),
                             json.dumps(conversation)))
            self.evict()

    def evict(self) -> None:
        self.db.execute("DELETE FROM responses WHERE id NOT IN "
                        "(SELECT id FROM responses ORDER BY created DESC, rowid DESC LIMIT ?)",
                        (self.max_rows,))

    def response(self, response_id: str) -> dict[str, Any] | None:
        row = self.row(response_id, "response")
        return None if row is None else dict(json.loads(row))

    def conversation(self, response_id: str) -> list[dict[str, Any]] | None:
        row = self.row(response_id, "conversation")
        return None if row is None else list(json.loads(row))

    def row(self, response_id: str, column: str) -> str | None:
        with self.lock:
            found = self.db.execute(f"SELECT {column} FROM responses WHERE id = ?",  # noqa: S608 - column is ours
                                    (response_id,)).fetchone()
        return None if found is None else str(found[0])

    def delete(self, response_id: str) -> bool:
        with self.lock:
            return self.db.execute("DELETE FROM responses WHERE id = ?",
                                   (response_id,)).rowcount > 0

    def close(self) -> None:
        with self.lock:
            self.db.close()
