"""Continuous batching: admits, chunks prefills, reserves K/V pages, preempts when out of pages.

Between steps requests join (waiting) and leave (finished or aborted). A step is either a
prefill step (new or preempted requests, chunked to a token budget) or a decode/verify step
over every running request; while both kinds have work they alternate, so decoding requests
keep going during a long chunked prefill. When pages run out the newest running request (by
arrival) is preempted: its pages go back to the pool and it is recomputed later from its tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from blockspec.engine.sequence import Sequence, Status
from blockspec.kv.allocator import PageAllocator


@dataclass
class ScheduledStep:
    kind: str                      # "prefill" | "decode"
    seqs: list[Sequence]
    chunk_lens: list[int]          # prefill only: tokens to cache this step per row


class Scheduler:
    def __init__(self, allocator: PageAllocator, max_running: int, max_prefill_tokens: int, lookahead: int,
                 steps_ahead: int = 0):
        """`lookahead` = cache positions a decode step writes past the committed length;
        `steps_ahead` = decode steps that may be in flight beyond the one the host has read
        (overlapped decoding: 1), each of which may cache up to `lookahead` positions more."""
        self.allocator = allocator
        self.max_running = max_running
        self.max_prefill_tokens = max_prefill_tokens
        self.lookahead = lookahead
        self.steps_ahead = steps_ahead
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._last_kind: str | None = None  # kind of the previous step

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence and return its pages."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.page_table.release(self.allocator)

    def schedule(self) -> ScheduledStep | None:
        while True:
            # After a prefill step running decodes go first, so that a long chunked prefill or a
            # stream of admissions cannot stall the requests that are already decoding.
            if self._last_kind == "prefill":
                step = self._schedule_decode() or self._schedule_prefill()
            else:
                step = self._schedule_prefill() or self._schedule_decode()
            if step is not None:
                self._last_kind = step.kind
                return step
            if not self.running:
                return None
            # Partly prefilled requests hold every page: give the newest one's back.
            self.preempt(self._newest_running())

    def _schedule_prefill(self) -> ScheduledStep | None:
        budget = self.max_prefill_tokens
        seqs, chunks = [], []
        # Running requests whose prompt is only partly cached go first, then admissions.
        candidates = [s for s in self.running if s.is_prefilling]
        for seq in candidates:
            n = min(seq.prefill_target - seq.num_cached, budget)
            if n <= 0 or not self._reserve(seq, seq.num_cached + n):
                break
            seqs.append(seq), chunks.append(n)
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            seq = self.waiting[0]
            n = min(seq.prefill_target - seq.num_cached, budget)
            # Admit only when the chunk and the first decode step both fit.
            need = seq.num_cached + n + (self.lookahead if n == seq.prefill_target - seq.num_cached else 0)
            if not self.allocator.can_allocate(seq.page_table.pages_needed(need)):
                break
            self._reserve(seq, seq.num_cached + n)
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            seqs.append(seq), chunks.append(n)
            budget -= n
        return ScheduledStep("prefill", seqs, chunks) if seqs else None

    def _schedule_decode(self) -> ScheduledStep | None:
        decoding = [s for s in self.running if not s.is_prefilling]
        i = 0
        while i < len(decoding):
            seq = decoding[i]
            if self._reserve(seq, self.decode_reach(seq)):
                i += 1
                continue
            # The newest request (by arrival) gives its pages back, also when it is one whose
            # prompt is only partly cached; then retry (seq itself may have been the victim).
            victim = self._newest_running()
            self.preempt(victim)
            for j, s in enumerate(decoding):
                if s is victim:
                    del decoding[j]
                    if j < i:
                        i -= 1
                    break
        return ScheduledStep("decode", decoding, []) if decoding else None

    def decode_reach(self, seq: Sequence) -> int:
        """Positions a decode step scheduled now may write up to (its own lookahead past the
        host's committed length, plus that of any step still in flight)."""
        return seq.num_cached + self.lookahead * (1 + self.steps_ahead)

    def can_decode_without_preempting(self) -> bool:
        """Every running request decodes (none prefilling, none waiting) and the pages of the
        next decode step fit: the batch can only shrink, so a step in flight may stay."""
        if self.waiting or any(s.is_prefilling for s in self.running):
            return False
        need = sum(s.page_table.pages_needed(self.decode_reach(s)) for s in self.running)
        return self.allocator.can_allocate(need)

    def commit_decode(self, seq: Sequence, num_new_cached: int) -> None:
        """After a verify step: `num_new_cached` positions (root + accepted) stay cached; the
        rejected positions past them are rolled back by the length alone (the next step writes
        them again before anything reads them). Pages past the next step's reach go back to the
        pool; those within it stay: freeing them would hand the same page back next step, a free
        and an allocation per row per step (with a 16-token lookahead every step of every row
        crosses into a page past its committed length)."""
        seq.num_cached += num_new_cached
        seq.page_table.truncate(self.allocator, self.decode_reach(seq))

    def _newest_running(self) -> Sequence:
        return max(self.running, key=lambda s: s.arrival)

    def preempt(self, seq: Sequence) -> None:
        """Free a running request's pages; it is recomputed from its tokens when readmitted."""
        self.running.remove(seq)
        seq.page_table.release(self.allocator)
        seq.num_cached = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _reserve(self, seq: Sequence, num_tokens: int) -> bool:
        if not self.allocator.can_allocate(seq.page_table.pages_needed(num_tokens)):
            return False
        seq.page_table.reserve(self.allocator, num_tokens)
        return True
