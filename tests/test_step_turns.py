"""Engines take turns at stepping (engine/step_turns.py): one step at a time, and a thread
that asks again right after its turn waits behind one already waiting."""

from __future__ import annotations

import threading
import time

from engine.step_turns import FairTurns


def test_one_turn_at_a_time_in_the_order_asked() -> None:
    turns = FairTurns()
    order: list[str] = []
    inside = 0
    most_inside = 0
    lock = threading.Lock()
    start = threading.Barrier(2)

    def steps(name: str, count: int) -> None:
        nonlocal inside, most_inside
        start.wait()
        for _ in range(count):
            with turns.turn():
                with lock:
                    inside += 1
                    most_inside = max(most_inside, inside)
                order.append(name)
                time.sleep(0.002)  # a step's work
                with lock:
                    inside -= 1

    threads = [threading.Thread(target=steps, args=(name, 20)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most_inside == 1
    assert sorted(order) == ["a"] * 20 + ["b"] * 20
    # Once both are stepping, neither takes two turns in a row while the other waits.
    first_b = order.index("b")
    both = 2 * order[first_b:].count("a")  # the turns taken while both were still stepping
    tail = order[first_b:first_b + both - 1]
    assert len(tail) >= 10, order
    assert all(x != y for x, y in zip(tail, tail[1:], strict=False)), order
