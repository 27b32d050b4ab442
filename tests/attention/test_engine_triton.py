"""The engine on the Triton backend (interpreter on CPU) gives the reference backend's greedy
output: ragged prefill batches, decode, DFlash blocks and DDTree trees, eager and through the
graph runner's static buffers."""

from __future__ import annotations

import pytest
import torch

from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.sampling import SamplingParams
from dflash_fixtures import write_dflash_drafter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, qwen3_dir):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("d"), qwen3_dir, block_size=4))


def generate(model, drafter, spec, backend, graphs):
    engine = Engine(EngineConfig(model=model, device=DEVICE, spec=spec, attention_backend=backend,
                                 draft_model=drafter if spec != "none" else None,
                                 tree_budget=4 if spec == "ddtree" else None, cuda_graph=graphs))
    if graphs and engine.graphed is None:
        engine.graphed = engine.capture_graphs()
    prompts = ([5, 6], [6, 6, 7], [7, 6, 7, 10, 11])          # ragged: rows of 2, 3 and 5 tokens
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    got = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
    return got


@pytest.mark.parametrize("spec,graphs", [("none", False), ("none", True), ("dflash", True), ("ddtree", True)])
def test_triton_engine_equals_reference(qwen3_dir, drafter, spec, graphs):
    assert generate(qwen3_dir, drafter, spec, "triton", graphs) == generate(qwen3_dir, drafter, spec, "reference", False)
