"""A decode step builds its device inputs once, with no per-token Python loop, and a DFlash
chain's drafts stay on the device from the drafter to the verifier (one host sync a step)."""

from __future__ import annotations

import pytest
import torch

import blockspec.batch as batch_module
import blockspec.engine.engine as engine_module
from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.kv.allocator import PageTable
from blockspec.sampling import SamplingParams
from dflash_fixtures import write_dflash_drafter


class Counter:
    def __init__(self, monkeypatch, owner, name):
        self.calls = 0
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)


def decoding_engine(qwen3_dir, drafter, spec):
    engine = Engine(EngineConfig(model=qwen3_dir, spec=spec, draft_model=drafter))
    for i, prompt in enumerate(([1, 2, 3, 4, 5], [7, 8, 9])):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.7 * i, max_tokens=30, ignore_eos=True))
    engine.step()                                   # prefill both
    assert all(not s.is_prefilling for s in engine.scheduler.running)
    return engine


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, qwen3_dir):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("d"), qwen3_dir, block_size=4))


@pytest.mark.parametrize("spec", ["none", "ngram", "dflash"])
def test_decode_step_builds_inputs_once_without_per_token_loops(qwen3_dir, drafter, spec, monkeypatch):
    engine = decoding_engine(qwen3_dir, drafter if spec == "dflash" else None, spec)
    built = Counter(monkeypatch, engine_module, "decode_inputs")
    packed = Counter(monkeypatch, batch_module, "pack_decode")
    copies = Counter(monkeypatch, batch_module.PackedStep, "to")
    per_token = Counter(monkeypatch, PageTable, "slot")
    for _ in range(3):
        engine.step()
    assert built.calls == 3
    assert packed.calls == 3
    assert copies.calls == 3                        # one flat tensor: page table, integer and float settings
    assert per_token.calls == 0                     # slots are computed on the device


def test_dflash_drafts_stay_on_the_device_until_verify(qwen3_dir, drafter, monkeypatch):
    engine = decoding_engine(qwen3_dir, drafter, "dflash")
    host_reads = Counter(monkeypatch, torch.Tensor, "tolist")
    copies_to_host = Counter(monkeypatch, torch.Tensor, "cpu")
    items = Counter(monkeypatch, torch.Tensor, "item")
    engine.step()
    assert host_reads.calls == 1                    # StepResult.from_device, after verify
    assert copies_to_host.calls == 0 and items.calls == 0


def test_counter_sees_a_per_token_loop(qwen3_dir, monkeypatch):
    """Negative control: the old way (a Python slot per position) is what the counter counts."""
    engine = decoding_engine(qwen3_dir, None, "none")
    per_token = Counter(monkeypatch, PageTable, "slot")
    seq = engine.scheduler.running[0]
    [seq.page_table.slot(p) for p in range(seq.num_cached)]
    assert per_token.calls == seq.num_cached > 0
