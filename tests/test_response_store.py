"""The Responses API's store, on a real SQLite file: what is saved is read back by a new
store on the same file (as after a restart), deletes are final, and past its bound the
oldest responses go first."""

from __future__ import annotations

from pathlib import Path

from server.runtime.response_store import ResponseStore


def response(index: int) -> dict[str, object]:
    return {"id": f"resp_{index}", "object": "response",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": str(index)}]}]}


def test_a_stored_conversation_survives_a_new_store_on_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "responses.sqlite"
    first = ResponseStore(path, max_rows=10)
    conversation = [{"type": "message", "role": "user", "content": "Hi"}, *response(1)["output"]]  # type: ignore[misc]
    first.save(response(1), conversation)
    first.close()
    reopened = ResponseStore(path, max_rows=10)
    assert reopened.response("resp_1") == response(1)
    assert reopened.conversation("resp_1") == conversation
    assert reopened.delete("resp_1") and not reopened.delete("resp_1")
    assert reopened.response("resp_1") is None and reopened.conversation("resp_1") is None


def test_the_oldest_responses_are_dropped_past_the_bound(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "responses.sqlite", max_rows=3)
    for index in range(5):
        store.save(response(index), [])
    kept = [index for index in range(5) if store.response(f"resp_{index}") is not None]
    assert kept == [2, 3, 4]
