"""The Triton MLA kernel equals the reference backend's MLA (one shared latent head: keys the
whole row, values its first R) for decode, chain and tree verify, prefill, split-K and float16;
and the engine on the Triton backend gives the reference's greedy tokens on a DeepSeek-V3
target, plain and with DDTree. Without CUDA it runs under Triton's interpreter (conftest.py)."""

import math

import pytest
import torch

from blockspec.attention import triton_mla
from blockspec.attention.metadata import causal_new_mask, full_new_mask, visibility_mask
from blockspec.attention.reference import masked_attention
from blockspec.attention.triton_mla import MLAConfig, mla_paged_attention
from blockspec.kv.cache import gather_slots
from test_triton_paged import random_tree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
assert DEVICE == "cuda" or isinstance(triton_mla._mla_attn_kernel,
                                      __import__("triton").runtime.interpreter.InterpretedFunction)


class LatentCase:
    """A random latent cache `[slots, R + P]` on shuffled pages (page 0 unused), queries `[B, Q, H, R + P]`."""

    def __init__(self, prefixes, new_lens, q_len, heads=5, latent=32, rope=8, page_size=8, seed=0,
                 dtype=torch.float32):
        gen = torch.Generator().manual_seed(seed)
        self.B, self.Q, self.page_size, self.latent = len(prefixes), q_len, page_size, latent
        self.prefix = torch.tensor(prefixes, dtype=torch.int32)
        self.new = torch.tensor(new_lens, dtype=torch.int32)
        need = [max(1, math.ceil((p + n) / page_size)) for p, n in zip(prefixes, new_lens)]
        num_pages = sum(need) + 2
        perm = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
        self.page_table = torch.zeros(self.B, max(need) + 1, dtype=torch.int32)
        for b, n in enumerate(need):
            self.page_table[b, :n] = torch.tensor([perm.pop() for _ in range(n)])
        self.rows = torch.randn(num_pages * page_size, latent + rope, generator=gen).to(dtype)
        self.q = torch.randn(self.B, q_len, heads, latent + rope, generator=gen).to(dtype)
        self.scale = 0.7 / math.sqrt(latent + rope)
        self.gen = gen

    def reference(self, new_mask):
        slots = gather_slots(self.page_table.long(), self.page_size)
        visible = visibility_mask(self.prefix.long(), self.new.long(), new_mask, slots.shape[1])
        rows = self.rows.float()[slots][:, :, None]
        return masked_attention(self.q.float(), rows, rows[..., :self.latent], visible, self.scale)

    def kernel(self, mode, new_mask=None, num_splits=None, config=None):
        out = mla_paged_attention(self.q.to(DEVICE), self.rows.to(DEVICE), self.page_table.to(DEVICE),
                                  self.prefix.to(DEVICE), self.new.to(DEVICE), self.scale, self.page_size,
                                  self.latent, mode, None if new_mask is None else new_mask.to(DEVICE), num_splits,
                                  config)
        assert out.dtype == self.q.dtype and out.shape == (*self.q.shape[:3], self.latent)
        return out.cpu()

    def assert_close(self, out, ref, atol=1e-4):
        for b in range(self.B):
            n = int(self.new[b])
            torch.testing.assert_close(out[b, :n].float(), ref[b, :n], atol=atol, rtol=atol)
            assert (out[b, n:] == 0).all(), "padded queries give zeros"


@pytest.mark.parametrize("splits", [1, 3])
def test_decode_and_padded_row(splits):
    case = LatentCase([0, 37, 21], [1, 1, 0], 1)
    case.assert_close(case.kernel("causal", num_splits=splits), case.reference(causal_new_mask(3, 1, "cpu")))


def test_chain_verify_and_prefill_causal():
    case = LatentCase([13, 0], [5, 9], 9, heads=3, seed=1)
    case.assert_close(case.kernel("causal"), case.reference(causal_new_mask(2, 9, "cpu")))


def test_full_block():
    case = LatentCase([11, 4], [4, 4], 4, seed=2)
    case.assert_close(case.kernel("full"), case.reference(full_new_mask(2, 4, "cpu")))


@pytest.mark.parametrize("splits", [1, 2])
def test_tree_verify(splits):
    case = LatentCase([19, 3], [12, 7], 12, heads=4, seed=3)
    mask, _ = random_tree(case, [12, 7])
    case.assert_close(case.kernel("tree", mask, num_splits=splits), case.reference(mask))


@pytest.mark.parametrize("config,splits", [(MLAConfig(8, 16, 2, 1, 1), 1), (MLAConfig(32, 16, 2, 1, 1), 3),
                                           (MLAConfig(16, 32, 4, 1, 1), 2),
                                           (triton_mla.mla_config(512, True, 8), 2),    # the GPU defaults
                                           (triton_mla.mla_config(512, True, 1), 1)])
def test_value_splits_and_wide_tiles(config, splits):
    """Tilings the GPU tuning chooses among: value columns split across programs (each writing
    its columns, one the log-sum-exp), tiles wider than a query's heads, with key splits; a
    chain verify and a tree, so tiles straddle queries."""
    case = LatentCase([21, 6, 40], [5, 2, 3], 5, heads=3, latent=64, seed=5)
    case.assert_close(case.kernel("causal", num_splits=splits, config=config),
                      case.reference(causal_new_mask(3, 5, "cpu")))
    mask, _ = random_tree(case, [5, 2, 3])
    case.assert_close(case.kernel("tree", mask, num_splits=splits, config=config), case.reference(mask))


def test_value_split_must_leave_whole_tiles():
    case = LatentCase([4], [1], 1)                      # latent 32: a 4-way split leaves 8 columns
    with pytest.raises(ValueError, match="v_splits"):
        case.kernel("causal", config=MLAConfig(16, 16, 4, 1, 1))


def test_float16():
    case = LatentCase([30, 9], [3, 1], 3, heads=4, seed=4, dtype=torch.float16)
    case.assert_close(case.kernel("causal"), case.reference(causal_new_mask(2, 3, "cpu")), atol=2e-3)


def test_refuses_mismatched_rows():
    case = LatentCase([4], [1], 1)
    with pytest.raises(ValueError, match="latent_dim"):
        mla_paged_attention(case.q, case.rows[:, :-1], case.page_table, case.prefix, case.new, 1.0, 8, 32, "causal")


@pytest.mark.parametrize("spec", ["none", "ddtree"])
def test_triton_engine_equals_reference_on_mla(deepseek_dir, tmp_path_factory, spec):
    from test_engine_triton import generate
    from dflash_fixtures import write_dflash_drafter
    drafter = str(write_dflash_drafter(tmp_path_factory.mktemp("mla_drafter"), deepseek_dir, block_size=4))
    assert generate(deepseek_dir, drafter, spec, "triton", False) == generate(deepseek_dir, drafter, spec, "reference", False)
