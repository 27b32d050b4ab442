"""`batch_invariant=True`: greedy speculative decoding (DFlash chains, DDTree trees) gives plain
greedy's tokens, and every position's logits are bit for bit plain's, whatever the verify width
or the batch beside it. Without CUDA the kernels run under Triton's interpreter (float32).

Logits are recorded at the target forward (`runner.verify`, which a plain step also runs at
width 1) by context: the tokens before and at the query (committed prefix + its tree path)."""

from __future__ import annotations

import pytest
import torch

from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.sampling import SamplingParams
from dflash_fixtures import write_dflash_drafter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPTS = ([5, 6], [7, 6, 7, 10, 11, 12, 9])     # ragged: each row verified beside the other


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, qwen3_dir):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("d"), qwen3_dir, block_size=4))


def record_verify_logits(engine) -> dict[tuple[int, ...], torch.Tensor]:
    """Wrap the engine's target forward: context tuple → that position's logits `[V]`."""
    store, real = {}, engine.runner.verify

    def verify(inputs, tree):
        logits, features = real(inputs, tree)
        parents, tokens = tree.parents.cpu(), tree.tokens.cpu()
        for b, seq in enumerate(inputs.seqs):
            base = tuple(seq.tokens[:int(inputs.prefix_lens[b])])
            for i in range(parents.shape[1]):
                if i and parents[b, i] < 0:
                    continue
                path, j = [], i
                while j >= 0:
                    path.append(int(tokens[b, j]))
                    j = int(parents[b, j])
                store[base + tuple(reversed(path))] = logits[b, i].detach().cpu().clone()
        return logits, features

    engine.runner.verify = verify
    return store


def generate(model, drafter, spec, batch_invariant=True, backend="auto"):
    engine = Engine(EngineConfig(model=model, device=DEVICE, spec=spec, batch_invariant=batch_invariant,
                                 attention_backend=backend, draft_model=drafter if spec != "none" else None,
                                 tree_budget=4 if spec == "ddtree" else None, cuda_graph=False))
    logits = record_verify_logits(engine)
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", list(p), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    out = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return out, logits


@pytest.fixture(scope="module")
def plain(qwen3_dir):
    return generate(qwen3_dir, None, "none")


def assert_same_logits(plain_logits, spec_logits):
    assert plain_logits, "no plain decode step was recorded"
    missing = [k for k in plain_logits if k not in spec_logits]
    assert not missing, f"{len(missing)} plain positions never verified, e.g. {missing[0]}"
    differ = [k for k in plain_logits if not torch.equal(plain_logits[k], spec_logits[k])]
    assert not differ, (f"{len(differ)}/{len(plain_logits)} positions differ, e.g. context {differ[0]}: "
                        f"max |Δ| {(plain_logits[differ[0]] - spec_logits[differ[0]]).abs().max():.3g}")


@pytest.mark.parametrize("spec", ["dflash", "ddtree"])
def test_greedy_speculative_equals_plain_bit_for_bit(qwen3_dir, drafter, plain, spec):
    plain_out, plain_logits = plain
    spec_out, spec_logits = generate(qwen3_dir, drafter, spec)
    assert spec_out == plain_out
    assert_same_logits(plain_logits, spec_logits)
    widths = {len(k) for k in spec_logits} - {len(k) for k in plain_logits}
    assert widths or len(spec_logits) > len(plain_logits), "the drafts verified nothing past plain's positions"


def test_flag_refuses_the_reference_backend(qwen3_dir):
    with pytest.raises(ValueError, match="batch_invariant needs attention_backend"):
        Engine(EngineConfig(model=qwen3_dir, device=DEVICE, batch_invariant=True, attention_backend="reference"))


def test_flag_refuses_moe(qwen3_moe_dir):
    with pytest.raises(ValueError, match="batch_invariant does not cover mixture-of-experts"):
        Engine(EngineConfig(model=qwen3_moe_dir, device=DEVICE, batch_invariant=True))


def test_without_the_flag_positions_differ(qwen3_dir, drafter):
    """The bit comparison can fail: the reference backend's verify of a chain rounds some
    positions differently from its width-1 steps (the tokens still agree on this fixture)."""
    plain_out, plain_logits = generate(qwen3_dir, None, "none", batch_invariant=False, backend="reference")
    spec_out, spec_logits = generate(qwen3_dir, drafter, "dflash", batch_invariant=False, backend="reference")
    with pytest.raises(AssertionError, match="positions differ"):
        assert_same_logits(plain_logits, spec_logits)
