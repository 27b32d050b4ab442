"""The persistent page-table store mirrors every sequence's pages through admissions, growth,
rollback, preemption and completion, and a step's page table is a gather of its rows."""

from __future__ import annotations

import torch

from blockspec.batch import page_table_tensor
from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.kv.allocator import PageAllocator, PageTable
from blockspec.kv.page_table import PageTableStore
from blockspec.sampling import SamplingParams


def test_rows_follow_reserve_truncate_and_release():
    store, alloc = PageTableStore(2, 6), PageAllocator(20, 4)
    a, b = PageTable(4, store=store), PageTable(4, store=store)
    a.reserve(alloc, 9)                                  # 3 pages
    b.reserve(alloc, 2)
    a.reserve(alloc, 13)                                 # one more
    assert store.table[a.row, :5].tolist() == a.pages + [0]
    a.truncate(alloc, 5)                                 # rollback to 2 pages
    assert store.table[a.row].tolist() == a.pages + [0] * 4
    row = b.row
    b.release(alloc)
    assert b.row is None and store.table[row].eq(0).all()
    c = PageTable(4, store=store)
    c.reserve(alloc, 1)
    assert c.row == row                                  # a released row is reused
    assert torch.equal(store.rows([a.row, c.row], 2), torch.tensor([a.pages, c.pages + [0]]))


def test_engine_store_matches_the_page_lists_through_preemption(qwen3_dir):
    # A pool of 12 pages of 4 tokens for 4 requests of 30 tokens: requests are preempted.
    engine = Engine(EngineConfig(model=qwen3_dir, kv_cache_tokens=48, page_size=4, max_running_requests=4))
    for i in range(4):
        engine.add_request(f"r{i}", [5 + i, 6, 7], SamplingParams(temperature=0, max_tokens=27, ignore_eos=True))
    store, preempted = engine.page_tables, 0
    while engine.has_unfinished_requests():
        engine.step()
        running = engine.scheduler.running
        preempted = max(preempted, sum(s.num_preemptions for s in running + list(engine.scheduler.waiting)))
        for seq in running:
            table = seq.page_table
            assert store.table[table.row].tolist() == table.pages + [0] * (store.max_pages - len(table.pages))
        if running:
            listed = [s.page_table.pages + [0] * (max(len(t.page_table.pages) for t in running) - len(s.page_table.pages))
                      for s in running]
            assert page_table_tensor(running, "cpu").tolist() == listed
    assert preempted > 0                                 # the pool was too small: preemption happened
    assert store.table.eq(0).all() and len(store._free) == 4
