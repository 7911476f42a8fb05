"""The ZMQ publisher of KV-event batches, on the wire as vLLM's ZmqEventPublisher.

- PUB socket, multipart frames `[topic, seq.to_bytes(8, "big"), msgpack batch]`, seq from 0. It
  binds when the endpoint has `*`, `::`, `ipc://` or `inproc://`, else connects (vLLM's rule).
- Replay (optional): a ROUTER socket on replay_endpoint. A client (DEALER) sends the 8-byte
  big-endian seq to start from; the server answers every buffered batch with seq >= start as
  `[identity, b"", seq, payload]`, then `[identity, b"", (-1) as 8 signed bytes, b""]`. This
  is vLLM's replay up to 0.31; 0.32 adds a topic frame, which pagode does not send.
- The last buffer_steps batches are kept for replay.

The engine thread only puts (timestamp, events) on a bounded queue and never waits: encoding,
sending and replay run on the publisher's own thread, which also owns the sockets (ZMQ
sockets are not thread-safe). When the queue is full the batch is dropped and counted,
rather than stall a step.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any

import msgspec
import zmq

from engine.kv_events_config import KVEventsConfig
from engine.observers.kv_events import encode_batch

log = logging.getLogger("pagode")

END_SEQ = (-1).to_bytes(8, "big", signed=True)
POLL_S = 0.05  # how long the thread waits for a batch before it looks at replay requests again
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 2.0


def binds(endpoint: str) -> bool:
    """vLLM's rule: a stable (wildcard or local) address is bound, a remote one connected to."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    def __init__(self, config: KVEventsConfig) -> None:
        self.config = config
        self.topic = config.topic.encode()
        self.dropped = 0  # batches lost to a full queue
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._queue: queue.Queue[tuple[float, list[Any]] | None] = queue.Queue(maxsize=config.max_queue_size)
        self._context = zmq.Context()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pagode-kv-events", daemon=True)
        self._thread.start()
        self._started.wait(START_TIMEOUT_S)
        if self._error is not None:
            self._context.term()
            raise ValueError(f"kv events: cannot open {config.endpoint}"
                             f"{' or ' + config.replay_endpoint if config.replay_endpoint else ''}: "
                             f"{self._error}") from self._error
        log.info("KV events: publishing on %s (%s), replay %s, topic %r, %s layout", config.endpoint,
                 "bound" if binds(config.endpoint) else "connected", config.replay_endpoint or "off",
                 config.topic, config.event_layout)

    def publish(self, events: list[Any]) -> None:
        """Queue one step's events; never blocks the engine."""
        try:
            self._queue.put_nowait((time.time(), events))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("KV events: the publisher's queue is full; %d batches dropped", self.dropped)

    def shutdown(self) -> None:
        """Send what is queued, then close the sockets."""
        try:
            self._queue.put(None, timeout=STOP_TIMEOUT_S)
        except queue.Full:
            log.warning("KV events: %d batches unsent at shutdown", self._queue.qsize())
        self._thread.join(STOP_TIMEOUT_S)

    # ---- the publisher's thread ----------------------------------------
    def _run(self) -> None:
        try:
            pub, replay = self._open()
        except zmq.ZMQError as err:
            self._error = err
            self._started.set()
            return
        self._started.set()
        encoder = msgspec.msgpack.Encoder()
        seq = 0
        try:
            while True:
                if replay is not None and replay.poll(0):
                    self._serve_replay(replay)
                try:
                    item = self._queue.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if item is None:
                    break
                payload = encode_batch(item[0], item[1], encoder)
                pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
                self.buffer.append((seq, payload))
                seq += 1
        except Exception:  # the engine goes on without events rather than die with them
            log.exception("KV events: the publisher stopped")
        finally:
            pub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)
            self._context.term()

    def _open(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes] | None]:
        pub: zmq.Socket[bytes] = self._context.socket(zmq.PUB)
        replay: zmq.Socket[bytes] | None = None
        try:
            pub.set_hwm(self.config.hwm)
            if binds(self.config.endpoint):
                pub.bind(self.config.endpoint)
            else:
                pub.connect(self.config.endpoint)
            if self.config.replay_endpoint is not None:
                replay = self._context.socket(zmq.ROUTER)
                replay.bind(self.config.replay_endpoint)
        except zmq.ZMQError:
            pub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)
            raise
        return pub, replay

    def _serve_replay(self, replay: zmq.Socket[bytes]) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("KV events: a replay request of %d frames is ignored (want identity, empty, "
                        "8-byte seq)", len(frames))
            return
        identity, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        for seq, payload in list(self.buffer):
            if seq >= start:
                replay.send_multipart((identity, b"", seq.to_bytes(8, "big"), payload))
        replay.send_multipart((identity, b"", END_SEQ, b""))
