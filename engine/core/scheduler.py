"""One step at a time: hand out a token budget across running and waiting requests.

Order each step: running decodes (one token each), then continuing prefills, then
new admissions. A long prompt is prefilled in chunks so it never stalls decodes.

Batching (EngineConfig.batching):
- static: a batch is formed only when the previous one has fully finished; each
  request reserves max_model_len positions; nobody joins a batch in flight.
- continuous: requests join and leave at every step, but still reserve
  max_model_len positions each.
- paged: blocks are handed out as sequences grow; admission keeps a watermark of
  free blocks; when a block is missing, the newest running sequence is preempted
  and later recomputed.

After the step's forward pass, `update` reads the executor's result: it records the K/V
computed, adds each request's sampled tokens (verifying drafts through engine/spec/), and
frees the requests that finished or failed; the engine's output processor then turns its
account into outputs.

Scheduling policy (vLLM's --scheduling-policy): fcfs serves the queue in arrival order;
priority orders the waiting queue by (priority, arrival), lower first, and keeps the running
list in that order too, so that preemption takes the lowest priority (newest among equals).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.draft_source import DraftSource
from engine.core.sequence import Sequence, SequenceStatus
from engine.core.step_result import Picked, R, SeqUpdate, StepResult
from engine.types.errors import InvalidRequestError

log = logging.getLogger("pagode")


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int
    num_draft: int = 0  # of num_new_tokens, draft tokens to verify (engine/spec/)

    @property
    def completes_prefill(self) -> bool:
        """After this step every token has K/V, so the last one yields a new token."""
        return self.seq.num_computed_tokens + self.num_new_tokens == len(self.seq)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)  # decodes, drafted decodes, prefills
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, max_model_len: int,
                 drafter: DraftSource | None = None, check_invariants: bool = False) -> None:
        """`drafter`: drafts decodes when the engine speculates. `check_invariants`: after every
        update, check the block accounting of every sequence (a walk over all blocks; for
        tests and simulations that want a broken invariant to fail at the step that broke it)."""
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.max_concurrent = 0
        self.drafter = drafter
        self.checks_invariants = check_invariants

    @property
    def reserves_whole_context(self) -> bool:
        return self.config.batching in ("static", "continuous")

    @property
    def watermark_blocks(self) -> int:
        if self.config.batching != "paged":
            return 0
        return int(self.config.watermark * self.block_manager.num_blocks)

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt admission can ever take: the blocks it may hand out (all but the
        watermark), less one position for the first decode. The engine refuses longer
        prompts up front (request_limits.check_context), and so does the planner's simulator."""
        usable_blocks = self.block_manager.num_blocks - self.watermark_blocks
        return max(usable_blocks * self.block_manager.block_size - 1, 0)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def by_priority(self) -> bool:
        return self.config.scheduling_policy == "priority"

    def add(self, seq: Sequence) -> None:
        if self.by_priority:
            self._insert_by_priority(seq)
        else:
            self.waiting.append(seq)

    def _insert_by_priority(self, seq: Sequence) -> None:
        key = priority_key(seq)
        for i, other in enumerate(self.waiting):
            if key < priority_key(other):
                self.waiting.insert(i, seq)
                return
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take seq out of the queues and free its blocks (finish or abort)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED

    # ---- the step ------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.by_priority:
            self.running.sort(key=priority_key)  # the lowest priority is preempted first
        budget = self._schedule_running(out, self.config.token_budget)
        if not out.preempted and self._may_admit():
            budget = self._schedule_waiting(out, budget)
        if self.drafter is not None:
            self._add_drafts(out, budget)
        # Decodes first, then drafted decodes, then prefill chunks (stable): the packed layout
        # wants one-token sequences first, and the CPU lays the drafted ones out as decode rows.
        out.scheduled.sort(key=lambda s: (s.num_new_tokens - s.num_draft != 1, s.num_draft > 0))
        self.max_concurrent = max(self.max_concurrent, len(self.running))
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        for seq in list(self.running):
            if budget == 0 or seq.status is not SequenceStatus.RUNNING:
                break
            n = 1 if not seq.is_prefilling else min(seq.num_uncomputed_tokens, budget)
            self.block_manager.free_outside_window(seq, seq.num_computed_tokens)
            if not self._make_room(seq, n, out):
                break  # seq itself was the newest and is preempted; so were all after it
            self.block_manager.append_slots(seq, n)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return budget

    def _add_drafts(self, out: SchedulerOutput, budget: int) -> None:
        """Give decodes drafts from what the step has left, once everyone else is scheduled:
        drafts never take budget from a prefill, never preempt, and the drafter sees the
        step's whole token count when it weighs their cost."""
        assert self.drafter is not None
        load = self.drafter.start_step(out.num_batched_tokens,
                                       sum(1 for s in out.scheduled if s.completes_prefill))
        for s in out.scheduled:
            if budget <= 0:
                break
            if s.num_new_tokens != 1 or s.seq.is_prefilling:
                continue
            draft = self.drafter.propose(s.seq, budget, load)
            while draft and not self.block_manager.can_append(s.seq, 1 + len(draft)):
                draft.pop()
            if not draft:
                continue
            self.drafter.take(s.seq, len(draft), load)
            self.block_manager.append_slots(s.seq, 1 + len(draft))
            s.seq.draft = draft
            s.seq.token_ids.extend(draft)
            s.num_new_tokens += len(draft)
            s.num_draft = len(draft)
            budget -= len(draft)

    def _make_room(self, seq: Sequence, n: int, out: SchedulerOutput) -> bool:
        while not self.block_manager.can_append(seq, n):
            victim = self.running[-1]
            self.preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        """Free seq's blocks and put it back at the head of the queue, to recompute."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.reset_for_recompute()  # drops an unverified draft too
        if self.by_priority:
            self._insert_by_priority(seq)
        else:
            self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _may_admit(self) -> bool:
        if self.config.batching == "static":
            return not self.running
        return True

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        static = self.config.batching == "static"
        while self.waiting and len(self.running) < self.config.max_num_seqs and (budget > 0 or static):
            seq = self.waiting[0]
            reserve = self.max_model_len if self.reserves_whole_context else len(seq)
            if not self.block_manager.can_allocate(seq, reserve, self.watermark_blocks):
                break
            self.waiting.popleft()
            self.block_manager.allocate(seq, reserve)
            seq.status = SequenceStatus.RUNNING
            if seq.times.scheduled is None:
                seq.times.scheduled = time.monotonic()
            self.running.append(seq)
            n = min(seq.num_uncomputed_tokens, budget)
            if n > 0:
                out.scheduled.append(ScheduledSeq(seq, n))
                budget -= n
        return budget

    # ---- after the forward pass -----------------------------------------
    def update(self, out: SchedulerOutput, result: StepResult[R]) -> list[SeqUpdate[R]]:
        """Take in the step's sampled tokens; return what each request gained (a failed or
        finished request is already out of the queues and its blocks freed)."""
        if result.error is not None:  # the batch is lost; its requests fail, the engine goes on
            return [self.fail(request, result.error) for request in result.requests]
        self.advance(out)
        now = time.monotonic()  # when the step's tokens came
        updates = []
        row = 0
        for request, draft in zip(result.requests, result.drafts, strict=True):
            updates.append(self._take(request, draft, result.picks, row, now))
            row += 1 + len(draft)
        if self.checks_invariants:
            self.check_invariants()
        return updates

    def _take(self, request: R, draft: list[int], picks: list[Picked | BaseException], row: int,
              now: float) -> SeqUpdate[R]:
        """One request's rows, from picks[row]: its new tokens, and its end when a stop rule
        says so."""
        seq = request.seq
        seq.times.first_token = seq.times.first_token or now
        seq.times.last_token = now
        try:
            if draft:
                assert self.drafter is not None
                rows = picks[row:row + 1 + len(draft)]
                tokens, logprobs, reason = self.drafter.verify(request, draft, rows, self.max_model_len)
            else:
                picked = picks[row]
                if isinstance(picked, BaseException):
                    raise picked
                token, lp = picked
                tokens, logprobs = [token], None if lp is None else [lp]
                reason = request.append(token, self.max_model_len)
        except Exception as err:  # one request's fault fails that request alone
            log.exception("request %s failed", seq.request_id)
            return self.fail(request, err)
        if reason is not None:
            self.finish(seq, reason)
        elif draft:
            self.finish_draft(seq)
        return SeqUpdate(request, tokens, logprobs)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a request (a stop rule, an abort, a failure): out of the queues, blocks freed."""
        seq.finish_reason = reason
        seq.times.finished = time.monotonic()
        self.remove(seq)

    def fail(self, request: R, err: BaseException) -> SeqUpdate[R]:
        """End a request with the error that stopped it."""
        seq = request.seq
        if isinstance(err, InvalidRequestError):  # the request's own fault: a 400 naming its field
            seq.error, seq.error_param = str(err), err.param or "request"
        else:
            seq.error = f"{type(err).__name__}: {err}"
        self.finish(seq, "abort")
        return SeqUpdate(request, [])

    def check_invariants(self) -> None:
        """Raise if any block is counted wrong (BlockManager.check_invariants)."""
        self.block_manager.check_invariants(list(self.running) + list(self.waiting))

    def advance(self, out: SchedulerOutput) -> None:
        """Record the K/V computed this step and publish full blocks to the prefix cache."""
        for s in out.scheduled:
            if s.num_draft:
                continue  # finished by finish_draft once the draft is verified
            s.seq.num_computed_tokens += s.num_new_tokens
            self.block_manager.commit_full_blocks(s.seq)

    def finish_draft(self, seq: Sequence) -> None:
        """After verification: the accepted tokens have K/V, the newest token has none yet;
        blocks past it are handed back, and only then are full blocks published, so no block
        holding a rejected draft is ever registered in the prefix cache."""
        seq.num_computed_tokens = len(seq) - 1
        self.block_manager.trim(seq, len(seq))
        self.block_manager.commit_full_blocks(seq)


def priority_key(seq: Sequence) -> tuple[int, float]:
    return (seq.params.priority, seq.times.arrival)
