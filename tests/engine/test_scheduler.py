"""Scheduler unit tests: pure host logic (PageAllocator + Sequences), no model.

A tiny stand-in for the engine (`apply`) does to the sequences what Engine.step does after a
step: prefill chunks advance num_cached (and sample the first token once the prompt is
cached); a decode step commits k tokens (k-1 accepted drafts + 1) through
`Scheduler.commit_decode`.
"""

from __future__ import annotations

import random

import pytest

from blockspec.engine.scheduler import Scheduler
from blockspec.engine.sequence import Sequence, Status
from blockspec.kv.allocator import PageAllocator, PageTable
from blockspec.sampling import SamplingParams

PAGE = 4


def make_seq(i: int, prompt_len: int, max_tokens: int = 8) -> Sequence:
    return Sequence(f"r{i}", list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens),
                    PageTable(PAGE), arrival=i)


def make_sched(num_pages: int, *, max_running: int = 8, max_prefill: int = 64, lookahead: int = 1):
    alloc = PageAllocator(num_pages, PAGE)
    return alloc, Scheduler(alloc, max_running, max_prefill, lookahead)


def pages_for(n_tokens: int) -> int:
    return -(-n_tokens // PAGE)


def apply(sched: Scheduler, step, commits: dict[str, int] | None = None, default: int = 1) -> list[Sequence]:
    """Play the engine's part after `step`; returns the sequences that finished (and removes them)."""
    commits = commits or {}
    finished = []
    if step.kind == "prefill":
        assert len(step.seqs) == len(step.chunk_lens)
        for s, n in zip(step.seqs, step.chunk_lens):
            assert n >= 1
            assert s.page_table.capacity >= s.num_cached + n, "chunk written past the reserved pages"
            sample = s.num_cached + n == s.prefill_target and s.num_output == 0
            s.num_cached += n
            assert s.num_cached <= s.prefill_target
            if sample:
                s.tokens.append(1000 + s.num_output)
                if s.num_output >= s.params.max_tokens:
                    finished.append(s)
    else:
        assert step.chunk_lens == []
        for s in step.seqs:
            assert not s.is_prefilling and s.num_cached == len(s.tokens) - 1
            assert s.page_table.capacity >= s.num_cached + sched.lookahead, "lookahead not reserved"
            k = max(1, min(commits.get(s.request_id, default), sched.lookahead,
                           s.params.max_tokens - s.num_output))
            s.tokens.extend(1000 + s.num_output + j for j in range(k))
            sched.commit_decode(s, k)
            assert len(s.page_table.pages) <= pages_for(sched.decode_reach(s)), "pages kept past the next reach"
            if s.num_output >= s.params.max_tokens:
                finished.append(s)
    for s in finished:
        s.status = Status.FINISHED
        sched.remove(s)
    return finished


def check_invariants(sched: Scheduler) -> None:
    alloc = sched.allocator
    held = [p for s in sched.running + list(sched.waiting) for p in s.page_table.pages]
    assert len(held) == len(set(held)), "a page is in two page tables"
    assert 0 not in held, "page 0 is reserved"
    assert alloc.num_used_pages == len(held), "pages leaked or double-freed"
    assert len(sched.running) <= sched.max_running
    for s in sched.waiting:
        assert s.status is Status.WAITING and s.num_cached == 0 and not s.page_table.pages
    for s in sched.running:
        assert s.status is Status.RUNNING


# ---- admission ------------------------------------------------------------------------------

def test_admission_limited_by_max_running():
    alloc, sched = make_sched(100, max_running=2)
    seqs = [make_seq(i, 5) for i in range(4)]
    for s in seqs:
        sched.add(s)
    step = sched.schedule()
    assert step.kind == "prefill" and step.seqs == seqs[:2] and step.chunk_lens == [5, 5]
    assert [s.status for s in seqs] == [Status.RUNNING] * 2 + [Status.WAITING] * 2
    assert list(sched.waiting) == seqs[2:]
    apply(sched, step)
    # Full: the next steps only decode the two running requests.
    for _ in range(3):
        step = sched.schedule()
        assert step.kind == "decode" and step.seqs == seqs[:2]
        apply(sched, step)
        check_invariants(sched)
    # One finishes -> exactly one more is admitted.
    sched.remove(seqs[0])
    step = sched.schedule()
    assert step.kind == "prefill" and step.seqs == [seqs[2]]
    assert sched.running == [seqs[1], seqs[2]] and list(sched.waiting) == [seqs[3]]
    check_invariants(sched)


def test_admission_limited_by_pages_including_the_lookahead():
    # 6 usable pages = 24 tokens; lookahead 5.
    alloc, sched = make_sched(7, lookahead=5)
    a, b = make_seq(0, 10), make_seq(1, 8)
    sched.add(a), sched.add(b)
    step = sched.schedule()
    # a needs pages for 10 + 5 = 15 tokens (4 pages) to be admitted; it holds only its chunk's 3.
    assert step.seqs == [a] and a.page_table.capacity == 12
    # b's prompt alone (2 pages) would fit the 3 free pages, but not with its first decode
    # step's lookahead (8 + 5 = 13 tokens = 4 pages): it waits, holding nothing.
    assert list(sched.waiting) == [b] and not b.page_table.pages and b.status is Status.WAITING
    apply(sched, step)
    step = sched.schedule()
    assert step.kind == "decode" and step.seqs == [a]
    assert a.page_table.capacity >= a.num_cached + 5
    check_invariants(sched)
    apply(sched, step, {"r0": 1})
    sched.remove(a)  # a leaves: b now fits
    assert alloc.num_free_pages == alloc.num_usable_pages
    step = sched.schedule()
    assert step.kind == "prefill" and step.seqs == [b]


def test_decode_reserves_the_lookahead_and_rollback_returns_it():
    alloc, sched = make_sched(50, lookahead=9)
    s = make_seq(0, 6, max_tokens=40)
    sched.add(s)
    apply(sched, sched.schedule())
    assert s.num_cached == 6 and s.num_output == 1
    step = sched.schedule()
    assert step.kind == "decode"
    # Verify writes positions num_cached .. num_cached + lookahead - 1.
    assert len(s.page_table.pages) == pages_for(6 + 9) == 4
    apply(sched, step, {"r0": 2})
    # Rolled back by the length; the pages stay, the next step reaches past them.
    assert s.num_cached == 8 and len(s.page_table.pages) == 4 and alloc.num_used_pages == 4
    step = sched.schedule()
    assert len(s.page_table.pages) == pages_for(8 + 9) == 5


def test_commit_keeps_the_next_steps_pages_and_frees_past_them():
    """A one-token step inside a page allocates and frees nothing; pages past the next step's
    reach (a wider lookahead than the scheduler's, here after a lookahead change) are freed."""
    alloc, sched = make_sched(50, lookahead=9)
    s = make_seq(0, 5, max_tokens=40)
    sched.add(s)
    apply(sched, sched.schedule())
    apply(sched, sched.schedule(), {"r0": 1})          # reached 5 + 9: 4 pages; cached 6
    free = alloc.num_free_pages
    for _ in range(2):                                  # reach 15, 16: the same 4 pages
        apply(sched, sched.schedule(), {"r0": 1})
    assert s.num_cached == 8 and alloc.num_free_pages == free and len(s.page_table.pages) == 4
    sched.lookahead = 1                                 # reach 8 + 1: 3 pages
    sched.commit_decode(s, 0)
    assert len(s.page_table.pages) == 3 and alloc.num_free_pages == free + 1


# ---- chunked prefill ------------------------------------------------------------------------

def test_chunked_prefill_interleaves_with_decode_steps():
    alloc, sched = make_sched(100, max_prefill=8, lookahead=3)
    short = make_seq(0, 4, max_tokens=30)
    sched.add(short)
    apply(sched, sched.schedule())
    apply(sched, sched.schedule())
    assert short.num_output == 2
    long = make_seq(1, 30, max_tokens=4)
    sched.add(long)
    kinds, chunks, short_outputs = [], [], []
    while long.is_prefilling or long.num_output == 0:
        step = sched.schedule()
        kinds.append(step.kind)
        if step.kind == "prefill":
            assert step.seqs == [long]
            chunks.append(step.chunk_lens[0])
            assert long.page_table.capacity >= long.num_cached + step.chunk_lens[0]
            assert long.num_output == 0  # nothing sampled before the last chunk
        else:
            assert step.seqs == [short]  # a partly cached prompt is never decoded
        apply(sched, step)
        short_outputs.append(short.num_output)
        check_invariants(sched)
        assert len(kinds) < 20
    assert chunks == [8, 8, 8, 6]
    assert long.num_cached == 30 and long.num_output == 1
    # The running request kept decoding between the chunks instead of stalling.
    assert kinds == ["prefill", "decode"] * 3 + ["prefill"]
    assert short_outputs[-1] == 2 + 3
    step = sched.schedule()
    assert step.kind == "decode" and step.seqs == [short, long]


def test_prefill_budget_is_shared_between_a_partial_prompt_and_admissions():
    alloc, sched = make_sched(100, max_prefill=10)
    a, b = make_seq(0, 14), make_seq(1, 7)
    sched.add(a), sched.add(b)
    step = sched.schedule()
    assert step.seqs == [a] and step.chunk_lens == [10]  # budget used up: b waits
    apply(sched, step)
    step = sched.schedule()
    assert step.kind == "prefill" and step.seqs == [a, b] and step.chunk_lens == [4, 6]
    apply(sched, step)
    assert a.num_output == 1 and b.num_output == 0 and b.num_cached == 6
    step = sched.schedule()
    # decode first (a is ready), then b's last chunk
    assert step.kind == "decode" and step.seqs == [a]
    apply(sched, step)
    step = sched.schedule()
    assert step.kind == "prefill" and step.seqs == [b] and step.chunk_lens == [1]


# ---- preemption ------------------------------------------------------------------------------

def test_preempts_the_newest_request_and_recomputes_it_later():
    # 8 usable pages = 32 tokens; lookahead 4.
    alloc, sched = make_sched(9, lookahead=4)
    old, new = make_seq(0, 8, max_tokens=14), make_seq(1, 8, max_tokens=14)
    sched.add(old), sched.add(new)
    apply(sched, sched.schedule())
    assert sched.running == [old, new]
    preempted_at = None
    for n_step in range(40):
        step = sched.schedule()
        check_invariants(sched)
        if new.status is Status.WAITING and preempted_at is None:
            preempted_at = n_step
            # The newest request gave its pages back and waits at the front, to be recomputed.
            assert new.num_preemptions == 1 and new.num_cached == 0 and not new.page_table.pages
            assert sched.waiting[0] is new and old in sched.running
            assert new.num_output > 0  # its committed tokens are kept
            kept_tokens = list(new.tokens)
        apply(sched, step, default=4)
        check_invariants(sched)
        if not sched.has_work():
            break
    assert preempted_at is not None, "the pool never ran out: test sizes are wrong"
    assert old.num_preemptions == 0
    assert old.status is Status.FINISHED and new.status is Status.FINISHED
    assert new.tokens[:len(kept_tokens)] == kept_tokens
    assert new.num_output == 14
    assert alloc.num_free_pages == alloc.num_usable_pages


def test_recompute_caches_all_but_the_last_token_and_does_not_resample():
    alloc, sched = make_sched(20, max_prefill=5, lookahead=2)
    s = make_seq(0, 6, max_tokens=20)
    sched.add(s)
    while s.num_output < 4:
        apply(sched, sched.schedule(), default=2)
    tokens = list(s.tokens)
    sched.preempt(s)
    assert s.num_cached == 0 and alloc.num_used_pages == 0 and sched.waiting[0] is s
    assert s.prefill_target == len(tokens) - 1
    chunks = []
    while s.is_prefilling or s.status is Status.WAITING:
        step = sched.schedule()
        assert step.kind == "prefill"
        chunks.append(step.chunk_lens[0])
        apply(sched, step)
    assert sum(chunks) == len(tokens) - 1 and max(chunks) <= 5
    assert s.tokens == tokens  # no token was sampled again
    assert sched.schedule().kind == "decode"


def test_victim_is_the_newest_even_when_its_prompt_is_only_partly_cached():
    """An old decoding request must not be preempted in favour of a newer one whose prompt is
    only partly cached: the newest (by arrival) gives its pages back."""
    # 9 usable pages = 36 tokens, chunks of 8, lookahead 4.
    alloc, sched = make_sched(10, max_prefill=8, lookahead=4)
    old = make_seq(0, 12, max_tokens=20)
    sched.add(old)
    apply(sched, sched.schedule())
    new = make_seq(1, 28, max_tokens=2)
    sched.add(new)
    victims = []
    for _ in range(60):
        step = sched.schedule()
        check_invariants(sched)
        victims += [s.request_id for s in (old, new) if s.status is Status.WAITING and s.num_preemptions
                    and s.request_id not in victims]
        apply(sched, step, default=4)
        if not sched.has_work():
            break
    assert not sched.has_work()
    assert old.num_preemptions == 0, "the oldest request was preempted for a newer one"
    assert victims == ["r1"]
    assert alloc.num_free_pages == alloc.num_usable_pages


# ---- abort ------------------------------------------------------------------------------------

@pytest.mark.parametrize("moment", ["waiting", "mid_prefill", "after_prefill", "mid_decode", "preempted"])
def test_abort_at_any_moment_frees_pages(moment):
    alloc, sched = make_sched(40, max_prefill=8, lookahead=5)
    other = make_seq(0, 5, max_tokens=30)
    victim = make_seq(1, 20, max_tokens=30)
    sched.add(other)
    apply(sched, sched.schedule())
    apply(sched, sched.schedule())  # one decode step: the next step is the victim's prefill
    sched.add(victim)
    if moment != "waiting":
        step = sched.schedule()
        assert step.kind == "prefill" and step.seqs == [victim]
        apply(sched, step)
        assert victim.is_prefilling
        if moment != "mid_prefill":
            while victim.is_prefilling:
                apply(sched, sched.schedule())
        if moment == "mid_decode":
            step = sched.schedule()
            while victim not in step.seqs:
                apply(sched, step)
                step = sched.schedule()
            assert victim.page_table.capacity >= victim.num_cached + 5  # lookahead held right now
        if moment == "preempted":
            sched.preempt(victim)
    held_by_victim = len(victim.page_table.pages)
    assert (held_by_victim > 0) == (moment in ("mid_prefill", "after_prefill", "mid_decode"))
    used_before = alloc.num_used_pages
    sched.remove(victim)
    assert alloc.num_used_pages == used_before - held_by_victim
    assert victim not in sched.running and victim not in sched.waiting
    sched.remove(victim)  # idempotent
    check_invariants(sched)
    while sched.has_work():
        step = sched.schedule()
        assert victim not in step.seqs
        apply(sched, step)
    assert alloc.num_free_pages == alloc.num_usable_pages


# ---- everything together ------------------------------------------------------------------------

def test_random_workloads_finish_everything_and_free_the_pool():
    preemptions = sum(run_random_workload(seed) for seed in range(6))
    assert preemptions > 0, "the random workloads never ran out of pages: sizes are wrong"


def run_random_workload(seed: int) -> int:
    """Random arrivals, prompt lengths, commits per step and aborts, in a pool that allows only a
    few requests at a time: invariants hold after every step, every request that was not
    aborted finishes with all its tokens, and the pool ends entirely free."""
    rng = random.Random(seed)
    lookahead = rng.choice([1, 4, 8])
    alloc, sched = make_sched(rng.randint(12, 24), max_running=rng.randint(2, 6),
                              max_prefill=rng.choice([6, 16, 64]), lookahead=lookahead)
    capacity = alloc.num_usable_pages * PAGE
    pending = []
    for i in range(30):
        max_tokens = rng.randint(1, 12)
        prompt_len = rng.randint(1, max(1, min(40, capacity - max_tokens - lookahead)))
        pending.append(make_seq(i, prompt_len, max_tokens))
    everyone = list(pending)
    aborted, finished = set(), set()
    for _ in range(2000):
        while pending and rng.random() < 0.3:
            sched.add(pending.pop(0))
        if sched.has_work() and rng.random() < 0.03:
            live = sched.running + list(sched.waiting)
            s = rng.choice(live)
            sched.remove(s)
            s.status = Status.FINISHED
            aborted.add(s.request_id)
        step = sched.schedule()
        if step is None:
            assert not sched.has_work(), "work left but nothing schedulable"
        else:
            commits = {s.request_id: rng.randint(1, lookahead) for s in step.seqs}
            finished.update(s.request_id for s in apply(sched, step, commits))
        check_invariants(sched)
        if not pending and not sched.has_work():
            break
    assert not pending and not sched.has_work(), "requests were still unfinished after 2000 steps"
    for s in everyone:
        if s.request_id not in aborted:
            assert s.request_id in finished
            assert s.num_output == s.params.max_tokens
    assert finished | aborted == {s.request_id for s in everyone}
    assert alloc.num_free_pages == alloc.num_usable_pages
    return sum(s.num_preemptions for s in everyone)
