"""The Triton paged-attention kernel equals the reference (gather through the page table, then
masked SDPA over `visibility_mask`) for decode, chain/tree verify, DFlash blocks, prefill, GQA,
split-K and sliding windows. Without CUDA it runs under Triton's interpreter (see conftest.py)."""

import math
import os

import pytest
import torch

from blockspec.attention import triton_paged
from blockspec.attention.metadata import causal_new_mask, full_new_mask, visibility_mask
from blockspec.attention.reference import masked_attention
from blockspec.attention.triton_paged import choose_num_splits, paged_attention
from blockspec.kv.cache import gather_slots
from blockspec.speculative.tree import tree_attention_mask

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Without CUDA the kernels must run under the interpreter (tests/conftest.py sets it): fail, not skip.
assert DEVICE == "cuda" or isinstance(triton_paged._paged_attn_kernel,
                                      __import__("triton").runtime.interpreter.InterpretedFunction), \
    f"no CUDA and triton_paged is not interpreted (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r})"

ATOL = 1e-4


class Case:
    """Random paged cache for one layer: rows on shuffled, non-contiguous pages (page 0 never used)."""

    def __init__(self, prefixes, new_lens, q_len, hq=4, hkv=2, d=32, page_size=16, seed=0,
                 dtype=torch.float32, extra_cols=1):
        gen = torch.Generator().manual_seed(seed)
        self.B, self.Q, self.page_size = len(prefixes), q_len, page_size
        self.prefix = torch.tensor(prefixes, dtype=torch.int32)
        self.new = torch.tensor(new_lens, dtype=torch.int32)
        need = [max(1, math.ceil((p + n) / page_size)) for p, n in zip(prefixes, new_lens)]
        num_pages = sum(need) + 3                       # page 0 + spare pages that stay unused
        perm = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
        cols = max(need) + extra_cols
        self.page_table = torch.zeros(self.B, cols, dtype=torch.int32)
        for b, n in enumerate(need):
            self.page_table[b, :n] = torch.tensor([perm.pop() for _ in range(n)])
        # Every slot holds random data, so reading a wrong slot shows up.
        self.k = torch.randn(num_pages * page_size, hkv, d, generator=gen).to(dtype)
        self.v = torch.randn(num_pages * page_size, hkv, d, generator=gen).to(dtype)
        self.q = torch.randn(self.B, q_len, hq, d, generator=gen).to(dtype)
        self.scale = 1 / math.sqrt(d)
        self.gen = gen

    def reference(self, new_mask, window=None, positions=None):
        slots = gather_slots(self.page_table.long(), self.page_size)
        visible = visibility_mask(self.prefix.long(), self.new.long(), new_mask, slots.shape[1], window,
                                  None if positions is None else positions.long())
        return masked_attention(self.q.float(), self.k.float()[slots], self.v.float()[slots], visible, self.scale)

    def kernel(self, mode, new_mask=None, window=None, positions=None, num_splits=None, q=None):
        dev = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
        out = paged_attention(dev(self.q if q is None else q), dev(self.k), dev(self.v), dev(self.page_table),
                              dev(self.prefix), dev(self.new), self.scale, self.page_size, mode,
                              new_mask=dev(new_mask), sliding_window=window, positions=dev(positions),
                              num_splits=num_splits)
        assert out.dtype == self.q.dtype and out.shape == self.q.shape
        return out.cpu()

    def assert_close(self, out, ref, atol=ATOL):
        assert torch.isfinite(out).all(), "padded or valid rows are not finite"
        for b in range(self.B):
            n = int(self.new[b])
            torch.testing.assert_close(out[b, :n].float(), ref[b, :n], atol=atol, rtol=atol)
            assert (out[b, n:] == 0).all(), "padded queries should give zeros"


def random_tree(case, new_lens):
    """Random parents (earlier nodes), −2 padding; ancestor mask and positions prefix + depth."""
    parents = torch.full((case.B, case.Q), -2, dtype=torch.long)
    depths = torch.zeros(case.B, case.Q, dtype=torch.long)
    for b, n in enumerate(new_lens):
        parents[b, 0] = -1
        for i in range(1, n):
            parents[b, i] = int(torch.randint(0, i, (1,), generator=case.gen))
            depths[b, i] = depths[b, parents[b, i]] + 1
    return tree_attention_mask(parents), case.prefix[:, None].long() + depths


@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 2), (8, 2)])
def test_decode(hq, hkv):
    """Q = 1, prefix lengths 0, not multiples of the page size, and spanning several pages."""
    case = Case([0, 37, 70], [1, 1, 1], 1, hq=hq, hkv=hkv, d=64)
    ref = case.reference(causal_new_mask(case.B, 1, "cpu"))
    case.assert_close(case.kernel("causal"), ref)


def test_decode_padded_row_and_int64_metadata():
    """A row with new_len 0 (batch padding) is all zeros; int64 page table / lengths work too."""
    case = Case([21, 5], [1, 0], 1, hq=4, hkv=1, d=32)
    case.page_table, case.prefix, case.new = case.page_table.long(), case.prefix.long(), case.new.long()
    case.assert_close(case.kernel("causal"), case.reference(causal_new_mask(case.B, 1, "cpu")))


def test_strided_lengths_and_page_table():
    """prefix/new lengths as column views of one packed tensor, the page table a strided view."""
    case = Case([33, 7, 50], [3, 2, 1], 3, hq=4, hkv=2, d=32, seed=12)
    ref = case.reference(causal_new_mask(case.B, 3, "cpu"))
    packed = torch.stack([case.prefix, case.new], dim=1)                 # [B, 2]: columns stride 2
    case.prefix, case.new = packed[:, 0], packed[:, 1]
    wide = torch.zeros(case.B, case.page_table.shape[1] * 2, dtype=case.page_table.dtype)
    wide[:, ::2] = case.page_table
    case.page_table = wide[:, ::2]
    assert case.prefix.stride(0) == 2 and case.page_table.stride(1) == 2
    case.assert_close(case.kernel("causal"), ref)


def test_chain_verify_causal():
    case = Case([13, 40, 0], [5, 3, 1], 5, hq=4, hkv=2, d=32)
    case.assert_close(case.kernel("causal"), case.reference(causal_new_mask(case.B, 5, "cpu")))


def test_tree_verify():
    case = Case([19, 3], [16, 9], 16, hq=4, hkv=2, d=32, seed=1)
    mask, _ = random_tree(case, [16, 9])
    case.assert_close(case.kernel("tree", new_mask=mask), case.reference(mask))


@pytest.mark.parametrize("prefixes,new_lens,q_len,hq", [([19, 40], [70, 33], 70, 4),   # 3 words, 3 query tiles
                                                         ([0, 129], [33, 32], 33, 2),    # a word boundary
                                                         ([5], [65], 65, 8)])            # DDTree-64's width
def test_wide_tree_verify_packed(prefixes, new_lens, q_len, hq):
    """Trees over several 32-key words and query tiles, the mask passed as bools and as the
    words `pack_tree_mask` makes (what the backend packs once per forward)."""
    case = Case(prefixes, new_lens, q_len, hq=hq, hkv=2, d=32, seed=13)
    mask, _ = random_tree(case, new_lens)
    ref = case.reference(mask)
    case.assert_close(case.kernel("tree", new_mask=mask), ref)
    case.assert_close(case.kernel("tree", new_mask=triton_paged.pack_tree_mask(mask)), ref)
    case.assert_close(case.kernel("tree", new_mask=mask, num_splits=3), ref)


def test_pack_tree_mask_bits():
    """Bit r % 32 of word r // 32 is key r, bit 31 as the int32 sign bit; wrong words are refused."""
    mask = torch.zeros(1, 40, 40, dtype=torch.bool)
    mask[0, 39, [0, 31, 32, 39]] = True
    words = triton_paged.pack_tree_mask(mask)
    assert words.dtype == torch.int32 and words.shape == (1, 40, 2)
    assert words[0, 39].tolist() == [1 - 2 ** 31, 1 | (1 << 7)]
    assert (words[0, :39] == 0).all()
    case = Case([3], [40], 40, seed=14)
    with pytest.raises(ValueError, match="ceil"):
        case.kernel("tree", new_mask=words[:, :, :1].contiguous())


def test_full_block():
    """DFlash drafting: the block sees itself bidirectionally."""
    case = Case([30, 0, 17], [16, 16, 10], 16, hq=4, hkv=2, d=32, seed=2)
    case.assert_close(case.kernel("full"), case.reference(full_new_mask(case.B, 16, "cpu")))


def test_prefill_from_empty():
    """Two query tiles (BLOCK_M 128 = 64 queries × 2 heads), the second row shorter than Q."""
    case = Case([0, 0], [70, 33], 70, hq=4, hkv=2, d=32, seed=3)
    case.assert_close(case.kernel("causal"), case.reference(causal_new_mask(case.B, 70, "cpu")))


def test_chunked_prefill_with_prefix():
    case = Case([48, 100], [40, 29], 40, hq=2, hkv=1, d=32, seed=4)
    case.assert_close(case.kernel("causal"), case.reference(causal_new_mask(case.B, 40, "cpu")))


@pytest.mark.parametrize("mode", ["causal", "tree"])
def test_split_k_equals_unsplit(mode):
    """Forced num_splits=3 over ~300 keys (three 128-key chunks) equals one split and the reference."""
    q_len = 1 if mode == "causal" else 8
    case = Case([290, 170], [q_len, q_len - 2 if q_len > 2 else 1], q_len, hq=4, hkv=2, d=32, seed=5)
    if mode == "tree":
        mask, _ = random_tree(case, case.new.tolist())
    else:
        mask = causal_new_mask(case.B, q_len, "cpu")
    kw = {"new_mask": mask} if mode == "tree" else {}
    one = case.kernel(mode, num_splits=1, **kw)
    three = case.kernel(mode, num_splits=3, **kw)
    case.assert_close(one, case.reference(mask))
    case.assert_close(three, case.reference(mask))
    torch.testing.assert_close(three, one, atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("window", [24, 100])
def test_sliding_window(window):
    """Causal chunk after a long prefix: cached keys before the window are skipped or masked
    (window 100: the window's edge falls inside a whole cached block, the unmasked fast path)."""
    case = Case([200, 90], [8, 5], 8, hq=4, hkv=2, d=32, seed=6)
    positions = case.prefix[:, None].long() + torch.arange(8)
    mask = causal_new_mask(case.B, 8, "cpu")
    ref = case.reference(mask, window=window, positions=positions)
    case.assert_close(case.kernel("causal", window=window, positions=positions), ref)
    case.assert_close(case.kernel("causal", window=window, positions=positions, num_splits=2), ref)


def test_sliding_window_tree():
    """Tree nodes' positions are prefix + depth, so siblings share a position."""
    case = Case([60, 33], [12, 7], 12, hq=4, hkv=2, d=32, seed=7)
    mask, positions = random_tree(case, [12, 7])
    ref = case.reference(mask, window=40, positions=positions)
    case.assert_close(case.kernel("tree", new_mask=mask, window=40, positions=positions), ref)


@pytest.mark.parametrize("d", [32, 64, 128])
def test_head_dims(d):
    case = Case([25, 9], [3, 2], 3, hq=4, hkv=2, d=d, seed=8)
    case.assert_close(case.kernel("causal"), case.reference(causal_new_mask(case.B, 3, "cpu")))


@pytest.mark.parametrize("page_size", [8, 32])
def test_other_page_sizes(page_size):
    case = Case([45, 70], [4, 2], 4, hq=4, hkv=2, d=32, page_size=page_size, seed=9)
    case.assert_close(case.kernel("causal"), case.reference(causal_new_mask(case.B, 4, "cpu")))


def test_strided_query_and_gqa_group_3():
    """q as a view of a fused projection (non-contiguous), and a group size that is not a power of 2."""
    case = Case([18, 40], [2, 2], 2, hq=6, hkv=2, d=32, seed=10)
    fused = torch.randn(case.B, 2, 6 * 32 * 3, generator=case.gen)
    case.q = fused[..., :6 * 32].view(case.B, 2, 6, 32)
    assert not case.q.is_contiguous()
    case.assert_close(case.kernel("causal"), case.reference(causal_new_mask(case.B, 2, "cpu")))


def test_float16():
    case = Case([30, 11], [4, 4], 4, hq=4, hkv=2, d=32, seed=11, dtype=torch.float16)
    out = case.kernel("causal")
    case.assert_close(out, case.reference(causal_new_mask(case.B, 4, "cpu")), atol=2e-3)


def test_choose_num_splits():
    # Decode with few programs and a long context: fill ~2 waves of 132 SMs, ≥ 256 keys a split.
    assert choose_num_splits(1, 8, 1, 8192, 1, 132) == 32
    assert choose_num_splits(1, 8, 1, 1024, 1, 132) == 4
    assert choose_num_splits(16, 8, 1, 8192, 1, 132) == 3
    # Enough programs, a short context, or a long Q: no split.
    assert choose_num_splits(64, 8, 1, 8192, 1, 132) == 1
    assert choose_num_splits(1, 8, 1, 128, 1, 132) == 1
    assert choose_num_splits(1, 8, 16, 8192, 1024, 132) == 1


def test_choose_num_splits_in_whole_waves():
    """One program per SM (MLA's 64-head tile with its 3-deep pipeline): whole waves, so the
    count that ends a wave exactly, not the one just past two waves."""
    from blockspec.attention.triton_mla import MLAConfig
    assert MLAConfig(64, 64, 1, 8, 3).programs_per_sm(576) == 1 and MLAConfig(16, 16, 1, 1, 1).programs_per_sm(576) == 0
    assert choose_num_splits(16, 1, 1, 32768, 1, 132) == 17                       # 272 programs: 3 waves
    assert choose_num_splits(16, 1, 1, 32768, 1, 132, programs_per_sm=1) == 8     # 128: one wave
    assert choose_num_splits(64, 1, 1, 4096, 1, 132, programs_per_sm=1) == 2      # 128 (5 were 320: 3 waves)
    assert choose_num_splits(3, 1, 1, 32768, 1, 132, programs_per_sm=1) == 44     # 132: one wave, under the cap
    assert choose_num_splits(1, 1, 1, 32768, 1, 132, programs_per_sm=1) == 64     # the cap
    assert choose_num_splits(16, 1, 1, 32768, 1024, 132, programs_per_sm=1) == 1  # long Q: no split


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kv_write_kernel_equals_the_index_copy(dtype):
    """One launch for K and V, from strided views of a merged projection, lands where
    `KVCache.write` puts them, and nowhere else."""
    from blockspec.attention.triton_kv_write import write_kv
    from blockspec.kv.cache import KVCache
    gen = torch.Generator().manual_seed(3)
    B, Q, H, D, layers = 3, 5, 2, 16, 2
    merged = torch.randn(B, Q, (4 + 2 * H) * D, generator=gen).to(dtype)
    k = merged[..., 4 * D:(4 + H) * D].view(B, Q, H, D)          # strided, like qkv_proj's split
    v = merged[..., (4 + H) * D:].view(B, Q, H, D)
    slots = torch.randperm(6 * 16 - 16, generator=gen)[:B * Q].view(B, Q) + 16
    expected = KVCache(layers, 6, 16, H, D, dtype, "cpu")
    expected.k.normal_(generator=gen)
    expected.v.normal_(generator=gen)
    got = KVCache(layers, 6, 16, H, D, dtype, DEVICE)
    got.k.copy_(expected.k)
    got.v.copy_(expected.v)
    expected.write(1, slots, k, v)
    assert write_kv(got.k[1], got.v[1], slots.to(DEVICE), k.to(DEVICE), v.to(DEVICE))
    assert torch.equal(got.k.cpu(), expected.k) and torch.equal(got.v.cpu(), expected.v)
