"""The batch-invariant attention kernel equals the reference, and a query's output has the same
bits whether it is decoded alone (width 1), verified in a chain of 17, a tree node, or beside
other rows. Without CUDA it runs under Triton's interpreter (tests/conftest.py sets it)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from blockspec.attention import triton_invariant
from blockspec.attention.metadata import causal_new_mask, full_new_mask, visibility_mask
from blockspec.attention.reference import masked_attention
from blockspec.attention.triton_invariant import invariant_attention, tree_ancestors
from blockspec.kv.cache import gather_slots
from blockspec.speculative.tree import tree_attention_mask

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
assert DEVICE == "cuda" or isinstance(triton_invariant._invariant_attn_kernel,
                                      __import__("triton").runtime.interpreter.InterpretedFunction), \
    f"no CUDA and triton_invariant is not interpreted (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r})"
PAGE = 16


def paged(rows_kv, gen):
    """Per-row K/V `[L_b, Hkv, D]` → (k_cache, v_cache, page_table) on shuffled pages (page 0
    unused, the rest random, so a wrong slot shows)."""
    need = [max(1, math.ceil(len(k) / PAGE)) for k, _ in rows_kv]
    num_pages = sum(need) + 2
    perm = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    hkv, d = rows_kv[0][0].shape[1:]
    k = torch.randn(num_pages * PAGE, hkv, d, generator=gen).to(rows_kv[0][0].dtype)
    v = torch.randn(num_pages * PAGE, hkv, d, generator=gen).to(rows_kv[0][0].dtype)
    table = torch.zeros(len(rows_kv), max(need) + 1, dtype=torch.int32)
    for b, (rk, rv) in enumerate(rows_kv):
        table[b, :need[b]] = torch.tensor([perm.pop() for _ in range(need[b])])
        slots = gather_slots(table[b:b + 1].long(), PAGE)[0, :len(rk)]
        k[slots], v[slots] = rk, rv
    return k, v, table


def run(q, k, v, table, prefix, new, mode, mask=None):
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    anc = None if mask is None else tuple(dev(t) for t in tree_ancestors(mask))
    out = invariant_attention(dev(q), dev(k), dev(v), dev(table), dev(torch.tensor(prefix, dtype=torch.int32)),
                              dev(torch.tensor(new, dtype=torch.int32)), 1 / math.sqrt(q.shape[-1]), PAGE, mode, anc)
    assert out.shape == q.shape and out.dtype == q.dtype
    return out.cpu()


def random_rows(lengths, hkv, d, dtype, gen):
    return [(torch.randn(n, hkv, d, generator=gen).to(dtype), torch.randn(n, hkv, d, generator=gen).to(dtype))
            for n in lengths]


def random_parents(n, gen, width):
    parents = torch.full((width,), -2, dtype=torch.long)
    parents[0] = -1
    for i in range(1, n):
        parents[i] = int(torch.randint(0, i, (1,), generator=gen))
    return parents


@pytest.mark.parametrize("mode", ["causal", "full", "tree"])
def test_equals_reference(mode):
    gen = torch.Generator().manual_seed(0)
    prefixes, news, Q, hq, hkv, d = [13, 40, 0], [5, 3, 2], 5, 4, 2, 32
    rows = random_rows([p + n for p, n in zip(prefixes, news)], hkv, d, torch.float32, gen)
    k, v, table = paged(rows, gen)
    q = torch.randn(3, Q, hq, d, generator=gen)
    if mode == "tree":
        mask = tree_attention_mask(torch.stack([random_parents(n, gen, Q) for n in news]))
    else:
        mask = (causal_new_mask if mode == "causal" else full_new_mask)(3, Q, "cpu")
    out = run(q, k, v, table, prefixes, news, mode, mask if mode == "tree" else None)
    slots = gather_slots(table.long(), PAGE)
    visible = visibility_mask(torch.tensor(prefixes), torch.tensor(news), mask, slots.shape[1])
    ref = masked_attention(q, k[slots], v[slots], visible, 1 / math.sqrt(d))
    for b, n in enumerate(news):
        torch.testing.assert_close(out[b, :n], ref[b, :n], atol=1e-4, rtol=1e-4)
        assert (out[b, n:] == 0).all()


def decode_alone(q_row, kv_rows, dtype_gen_seed):
    """q_row `[Hq, D]` over exactly `kv_rows` (positions 0..L-1; the last one new) at width 1."""
    gen = torch.Generator().manual_seed(dtype_gen_seed)
    k, v, table = paged([kv_rows], gen)
    return run(q_row[None, None], k, v, table, [len(kv_rows[0]) - 1], [1], "causal")[0, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_chain_of_17_equals_width_1_and_batch_companions(dtype):
    gen = torch.Generator().manual_seed(1)
    hq, hkv, d, width = 4, 2, 32, 17
    prefixes = [37, 5, 50]                                   # the row under test is row 0
    rows = random_rows([p + width for p in prefixes], hkv, d, dtype, gen)
    k, v, table = paged(rows, gen)
    q = torch.randn(3, width, hq, d, generator=gen).to(dtype)
    batch = run(q, k, v, table, prefixes, [width] * 3, "causal")
    alone = run(q[:1], k, v, table[:1], prefixes[:1], [width], "causal")
    assert torch.equal(batch[0], alone[0])                   # batch companions change nothing
    short = run(q[:1, :4], k, v, table[:1], prefixes[:1], [4], "causal")     # a verify of width 4
    assert torch.equal(short[0], alone[0, :4])
    for j in (0, 7, 16):
        pos = prefixes[0] + j
        kv = (rows[0][0][:pos + 1], rows[0][1][:pos + 1])
        assert torch.equal(decode_alone(q[0, j], kv, 99), alone[0, j]), f"query {j}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tree_node_equals_width_1_decode_of_its_path(dtype):
    gen = torch.Generator().manual_seed(2)
    hq, hkv, d, width, prefix = 4, 1, 32, 12, 29
    rows = random_rows([prefix + width], hkv, d, dtype, gen)
    k, v, table = paged(rows, gen)
    parents = random_parents(width, gen, width)
    mask = tree_attention_mask(parents[None])
    q = torch.randn(1, width, hq, d, generator=gen).to(dtype)
    tree = run(q, k, v, table, [prefix], [width], "tree", mask)
    anc, depth = tree_ancestors(mask)
    checked_deep = False
    for i in range(width):
        path = anc[0, i, :int(depth[0, i]) + 1].long()
        assert path[-1] == i and (path[0] == 0)
        idx = torch.cat([torch.arange(prefix), prefix + path])
        kv = (rows[0][0][idx], rows[0][1][idx])
        assert torch.equal(decode_alone(q[0, i], kv, 7), tree[0, i]), f"node {i}"
        checked_deep |= bool((path != torch.arange(len(path))).any())   # a path off the node order
    assert checked_deep


def test_a_width_dependent_key_block_would_be_caught(monkeypatch):
    """The bit checks can fail: another key block (as the paged kernel picks per width) changes
    a query's bits."""
    # Several key blocks with large, varied scores: on the GPU a short row regrouped into fewer
    # blocks can round to the same bits by chance (70 keys did, in the H200 run).
    gen = torch.Generator().manual_seed(3)
    kv = random_rows([517], 2, 32, torch.float32, gen)[0]
    q = 3 * torch.randn(4, 32, generator=gen)
    base = decode_alone(q, kv, 5)
    tile = triton_invariant.CUDA_TILE if DEVICE == "cuda" else triton_invariant.INTERPRETER_TILE
    monkeypatch.setattr(triton_invariant, "CUDA_TILE" if DEVICE == "cuda" else "INTERPRETER_TILE",
                        (tile[0] * 2,) + tile[1:])
    assert not torch.equal(decode_alone(q, kv, 5), base)


def test_tree_ancestors():
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3, -2]])
    anc, depth = tree_ancestors(tree_attention_mask(parents))
    assert depth[0, :6].tolist() == [0, 1, 1, 2, 2, 3]
    assert anc[0, 5, :4].tolist() == [0, 1, 3, 5] and anc[0, 4, :3].tolist() == [0, 2, 4]


def test_backend_refuses_what_it_does_not_cover():
    from blockspec.attention.backend import select_backend
    from blockspec.attention.invariant_backend import BatchInvariantBackend
    with pytest.raises(ValueError, match="batch_invariant needs attention_backend 'triton' or 'auto'"):
        select_backend("reference", torch.device(DEVICE), batch_invariant=True)
    backend = select_backend("auto", torch.device(DEVICE), batch_invariant=True)
    assert isinstance(backend, BatchInvariantBackend)
    with pytest.raises(ValueError, match="batch_invariant attention has no sliding window"):
        backend.plan(None, None, sliding_window=8)
    with pytest.raises(ValueError, match="batch_invariant does not cover MLA"):
        backend.mla_forward(None, None, None, 0, None, 1.0)
