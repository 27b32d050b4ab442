"""Paged attention with prefix + tree masks equals dense masked attention; rollback and
compaction leave the cache as if the dropped tokens had never been there."""

import torch

from blockspec.attention.metadata import AttentionBatch, causal_new_mask, visibility_mask
from blockspec.attention.reference import paged_attention
from blockspec.kv.allocator import OutOfPages, PageAllocator, PageTable
from blockspec.kv.cache import KVCache, compaction_slots, gather_slots

H_Q, H_KV, D, PAGE = 4, 2, 8, 4


def random_tree_mask(q: int, gen: torch.Generator) -> torch.Tensor:
    """A random tree over q new tokens: node i's parent is a random earlier node."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, q)]
    mask = torch.zeros(q, q, dtype=torch.bool)
    for i in range(q):
        j = i
        while j != -1:
            mask[i, j] = True
            j = parents[j]
    return mask


def dense_reference(q, k_all, v_all, prefix, new_len, new_mask, scale):
    """Per row, plain attention over the row's own contiguous K/V with an explicit mask."""
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        n_keys = prefix[b] + new_len[b]
        keys = k_all[b][:n_keys].repeat_interleave(H_Q // H_KV, dim=1)
        vals = v_all[b][:n_keys].repeat_interleave(H_Q // H_KV, dim=1)
        for i in range(new_len[b]):
            allowed = torch.zeros(n_keys, dtype=torch.bool)
            allowed[:prefix[b]] = True
            allowed[prefix[b]:] = new_mask[b, i, :new_len[b]]
            scores = torch.einsum("hd,khd->hk", q[b, i], keys) * scale
            scores = scores.masked_fill(~allowed, float("-inf"))
            out[b, i] = torch.einsum("hk,khd->hd", scores.softmax(-1), vals)
    return out


def setup_rows(prefixes, new_lens, gen):
    alloc = PageAllocator(64, PAGE)
    cache = KVCache(1, 64, PAGE, H_KV, D, torch.float32, "cpu")
    tables = []
    k_all, v_all = [], []
    for p, n in zip(prefixes, new_lens):
        t = PageTable(PAGE)
        t.reserve(alloc, p + n)
        tables.append(t)
        k_all.append(torch.randn(p + n, H_KV, D, generator=gen))
        v_all.append(torch.randn(p + n, H_KV, D, generator=gen))
        # the prefix is already cached
        if p:
            slots = torch.tensor([[t.slot(i) for i in range(p)]])
            cache.write(0, slots, k_all[-1][None, :p], v_all[-1][None, :p])
    return alloc, cache, tables, k_all, v_all


def build_batch(tables, prefixes, new_lens, new_mask):
    q = new_mask.shape[1]
    width = max(len(t.pages) for t in tables)
    page_table = torch.tensor([t.pages + [0] * (width - len(t.pages)) for t in tables])
    slots = torch.tensor([[t.slot(p + i) for i in range(n)] + [0] * (q - n)
                          for t, p, n in zip(tables, prefixes, new_lens)])
    return AttentionBatch(slots, page_table, torch.tensor(prefixes), torch.tensor(new_lens), new_mask)


def run_paged(cache, batch, q, k_all, v_all, prefixes, new_lens):
    Q = q.shape[1]
    k_new = torch.zeros(len(prefixes), Q, H_KV, D)
    v_new = torch.zeros_like(k_new)
    for b, (p, n) in enumerate(zip(prefixes, new_lens)):
        k_new[b, :n], v_new[b, :n] = k_all[b][p:p + n], v_all[b][p:p + n]
    visible = batch.visibility(PAGE)
    return paged_attention(q, k_new, v_new, cache, 0, batch.slots, batch.page_table, visible, D ** -0.5)


def test_tree_mask_paged_attention_matches_dense_reference():
    gen = torch.Generator().manual_seed(0)
    prefixes, new_lens, Q = [5, 0, 13], [6, 4, 1], 6
    alloc, cache, tables, k_all, v_all = setup_rows(prefixes, new_lens, gen)
    new_mask = torch.stack([random_tree_mask(Q, gen) for _ in prefixes])
    batch = build_batch(tables, prefixes, new_lens, new_mask)
    q = torch.randn(3, Q, H_Q, D, generator=gen)
    out = run_paged(cache, batch, q, k_all, v_all, prefixes, new_lens)
    ref = dense_reference(q, k_all, v_all, prefixes, new_lens, new_mask, D ** -0.5)
    for b, n in enumerate(new_lens):
        torch.testing.assert_close(out[b, :n], ref[b, :n], rtol=1e-5, atol=1e-5)


def test_causal_prefill_and_decode_match_dense():
    gen = torch.Generator().manual_seed(1)
    prefixes, new_lens = [0, 0], [7, 3]
    alloc, cache, tables, k_all, v_all = setup_rows(prefixes, new_lens, gen)
    mask = causal_new_mask(2, 7, "cpu")
    batch = build_batch(tables, prefixes, new_lens, mask)
    q = torch.randn(2, 7, H_Q, D, generator=gen)
    out = run_paged(cache, batch, q, k_all, v_all, prefixes, new_lens)
    ref = dense_reference(q, k_all, v_all, prefixes, new_lens, mask, D ** -0.5)
    for b, n in enumerate(new_lens):
        torch.testing.assert_close(out[b, :n], ref[b, :n], rtol=1e-5, atol=1e-5)
    # decode one more token for each row on top of the cached prefill
    for t, n in zip(tables, new_lens):
        t.reserve(alloc, n + 1)
    k_ext = [torch.cat([k, torch.randn(1, H_KV, D, generator=gen)]) for k in k_all]
    v_ext = [torch.cat([v, torch.randn(1, H_KV, D, generator=gen)]) for v in v_all]
    batch = build_batch(tables, new_lens, [1, 1], torch.ones(2, 1, 1, dtype=torch.bool))
    q1 = torch.randn(2, 1, H_Q, D, generator=gen)
    out = run_paged(cache, batch, q1, k_ext, v_ext, new_lens, [1, 1])
    ref = dense_reference(q1, k_ext, v_ext, new_lens, [1, 1], torch.ones(2, 1, 1, dtype=torch.bool), D ** -0.5)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_spare_pages_are_cut_from_the_reference_plan_and_change_nothing():
    """Rows holding pages for a later, wider step (the scheduler's reach): the reference plan
    gathers only the pages the step's tokens occupy, and the output equals the dense reference
    even with garbage in the spare pages."""
    from blockspec.attention.reference import ReferenceBackend
    gen = torch.Generator().manual_seed(4)
    prefixes, new_lens, Q = [5, 13], [3, 1], 3
    alloc, cache, tables, k_all, v_all = setup_rows(prefixes, new_lens, gen)
    for t, p, n in zip(tables, prefixes, new_lens):
        t.reserve(alloc, p + n + 3 * PAGE)                      # three spare pages a row
        spare = torch.tensor([[t.slot(i) for i in range(p + n, len(t.pages) * PAGE)]])
        cache.write(0, spare, torch.full((1, spare.shape[1], H_KV, D), 1e3), torch.full((1, spare.shape[1], H_KV, D), 1e3))
    mask = causal_new_mask(2, Q, "cpu")
    batch = build_batch(tables, prefixes, new_lens, mask)
    plan = ReferenceBackend().plan(batch, cache)
    assert batch.page_table.shape[1] == 7 and plan.batch.page_table.shape[1] == 4   # ceil((13 + 3) / 4)
    q = torch.randn(2, Q, H_Q, D, generator=gen)
    k_new = torch.stack([torch.cat([k[p:p + n], torch.zeros(Q - n, H_KV, D)]) for k, p, n in zip(k_all, prefixes, new_lens)])
    v_new = torch.stack([torch.cat([v[p:p + n], torch.zeros(Q - n, H_KV, D)]) for v, p, n in zip(v_all, prefixes, new_lens)])
    out = ReferenceBackend().forward(q, k_new, v_new, cache, 0, plan, D ** -0.5)
    ref = dense_reference(q, k_all, v_all, prefixes, new_lens, mask, D ** -0.5)
    for b, n in enumerate(new_lens):
        torch.testing.assert_close(out[b, :n], ref[b, :n], rtol=1e-5, atol=1e-5)


def test_sliding_window_hides_old_keys():
    prefix = torch.tensor([6])
    mask = visibility_mask(prefix, torch.tensor([2]), torch.ones(1, 2, 2, dtype=torch.bool), 8, 3,
                           torch.tensor([[6, 7]]))
    # query at position 6 sees keys 4, 5, 6, 7 minus those ≥ 3 behind: 4..7 → window keeps 4,5,6 (+7 ahead)
    assert mask[0, 0, 0].tolist() == [False, False, False, False, True, True, True, True]
    assert mask[0, 0, 1].tolist() == [False, False, False, False, False, True, True, True]


def test_allocator_accounting_and_rollback():
    alloc = PageAllocator(5, PAGE)
    t = PageTable(PAGE)
    t.reserve(alloc, 9)              # 3 pages
    assert alloc.num_used_pages == 3 and alloc.num_free_pages == 1
    assert 0 not in t.pages
    t.truncate(alloc, 4)             # roll back to 4 tokens → 1 page
    assert len(t.pages) == 1 and alloc.num_free_pages == 3
    try:
        t.reserve(alloc, 100)
        raise AssertionError("expected OutOfPages")
    except OutOfPages:
        pass
    assert alloc.num_free_pages == 3  # a failed reservation takes nothing
    t.release(alloc)
    assert alloc.num_free_pages == 4


def test_compaction_equals_cache_that_only_saw_kept_entries():
    gen = torch.Generator().manual_seed(2)
    alloc = PageAllocator(16, PAGE)
    t = PageTable(PAGE)
    prefix, appended = 5, 7
    t.reserve(alloc, prefix + appended)
    cache = KVCache(2, 16, PAGE, H_KV, D, torch.float32, "cpu")
    clean = KVCache(2, 16, PAGE, H_KV, D, torch.float32, "cpu")
    k = torch.randn(2, prefix + appended, H_KV, D, generator=gen)
    v = torch.randn(2, prefix + appended, H_KV, D, generator=gen)
    slots = torch.tensor([[t.slot(i) for i in range(prefix + appended)]])
    for layer in range(2):
        cache.write(layer, slots, k[layer][None], v[layer][None])
    keep = [0, 2, 3, 6]                                   # increasing offsets among appended
    page_table = torch.tensor([t.pages])
    offsets = torch.tensor([keep + [-1, -1]])
    mask = torch.tensor([[True] * 4 + [False] * 2])
    src, dst = compaction_slots(page_table, PAGE, torch.tensor([prefix]), offsets, mask)
    cache.move(src, dst)
    kept_positions = list(range(prefix)) + [prefix + o for o in keep]
    kept_slots = torch.tensor([[t.slot(i) for i in range(len(kept_positions))]])
    for layer in range(2):
        clean.write(layer, kept_slots, k[layer][None, kept_positions], v[layer][None, kept_positions])
    t.truncate(alloc, len(kept_positions))
    live = gather_slots(torch.tensor([t.pages]), PAGE)[0, :len(kept_positions)]
    torch.testing.assert_close(cache.k[:, live], clean.k[:, live])
    torch.testing.assert_close(cache.v[:, live], clean.v[:, live])
