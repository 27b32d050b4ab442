"""The adaptive speculation policy in the engine (engine/spec_policy.py, docs/adaptive.md)."""

import itertools

import pytest
import torch

import blockspec.speculative.step as step_module
from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.engine.spec_policy import SpecPolicy
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams
from dflash_fixtures import write_dflash_drafter
from test_lossless import ALPHA, over_accepting_verify_tree, exact_laws, law_fit, spec_llm
from test_spec_greedy import OracleProposer, prompts_for

LONG = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)


class AdversaryProposer(OracleProposer):
    """Drafts the token after the target's: every draft is rejected."""

    def propose(self, seqs, inputs, width=None):
        tree, probs = super().propose(seqs, inputs, width)
        tree.tokens[:, 1:] = (tree.tokens[:, 1:] + 1) % 512
        return tree, probs


@pytest.fixture(scope="module")
def long_plain(qwen3_dir):
    prompts = prompts_for(512, [6, 14], seed=5)
    return prompts, [o.token_ids for o in LLM(model=qwen3_dir).generate(prompts, LONG)]


def _configurations(outs) -> dict:
    total = {}
    for o in outs:
        for name, n in o.metrics.configurations.items():
            total[name] = total.get(name, 0) + n
    return total


@pytest.mark.parametrize("proposer, favourite", [(AdversaryProposer, "plain"), (OracleProposer, "tree7")])
def test_policy_picks_plain_for_an_adversary_and_the_full_block_for_an_oracle(qwen3_dir, long_plain, proposer,
                                                                             favourite, monkeypatch):
    """The engine's real steps and acceptance, with a synthetic clock: a step costs 10 ms × (1 + 0.1 w)
    (a shared CPU's timings are too noisy for a test; the policy's timing is unit-tested)."""
    real_observe = SpecPolicy.observe

    def observe(self, seqs, width, step, now=None):
        self.clock = getattr(self, "clock", 0.0) + 0.01 * (1 + 0.1 * width)
        real_observe(self, seqs, width, step, now=self.clock)
    monkeypatch.setattr(SpecPolicy, "observe", observe)
    prompts, expected = long_plain
    drafter = proposer({tuple(p): e for p, e in zip(prompts, expected)}, 7)
    engine = Engine(EngineConfig(model=qwen3_dir, spec="dflash", spec_policy="adaptive"), proposer=drafter)
    outs = LLM.from_engine(engine).generate(prompts, LONG)
    assert [o.token_ids for o in outs] == expected
    counts = _configurations(outs)
    steps = sum(counts.values())
    # Widths are timed first, the full one then narrowest first (3 steps each), probes re-time the others: the favourite
    # dominates. The oracle's every width can win, so each is timed; the adversary's rejected drafts
    # make the wider ones lose even at a narrower one's cost, so timing stops early.
    assert counts.get(favourite, 0) >= 0.6 * steps, counts
    if favourite != "plain":
        assert all(n >= 2 * 3 for n in counts.values()), counts   # (2 rows × 3 steps)
    else:
        assert counts["tree7"] < counts["plain"] / 5, counts
    assert set(counts) <= {"plain", "tree1", "tree3", "tree7"}   # the test proposers do not promise chains


def test_mixed_batch_commits_what_plain_greedy_decoding_would(qwen3_dir, tmp_path):
    """Rows that speculate and rows that decode plainly (width 1) in one verify, changing per step."""
    drafter = write_dflash_drafter(tmp_path / "drafter", qwen3_dir, block_size=8)
    prompts = prompts_for(512, [7, 19, 3, 30], seed=2)
    greedy = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    expected = [o.token_ids for o in LLM(model=qwen3_dir).generate(prompts, greedy)]
    llm = LLM(model=qwen3_dir, spec="dflash", draft_model=str(drafter), spec_policy="static")
    real, counter, seen = llm.engine.spec_step.run, itertools.count(), []

    def mixed(runner, inputs, graphed=None, width=None, row_widths=None):
        k = next(counter)
        rows = torch.tensor([[1, 8, 3, 5][(i + k) % 4] for i in range(inputs.batch_size)])
        step = real(runner, inputs, None, 8, rows)
        seen.append((rows.tolist(), step.drafted))
        return step
    llm.engine.spec_step.run = mixed
    outs = llm.generate(prompts, greedy)
    assert [o.token_ids for o in outs] == expected
    assert any(1 in rows and 8 in rows for rows, _ in seen)
    assert all(d <= w - 1 for rows, drafted in seen for w, d in zip(rows, drafted))
    assert any(d == 0 for _, drafted in seen for d in drafted) and any(d > 2 for _, drafted in seen for d in drafted)


def cycling_choose(self, seqs):
    """A stand-in policy whose widths change every step (from a step count: the past only)."""
    self._k = getattr(self, "_k", -1) + 1
    return self.widths[self._k % len(self.widths)]


@pytest.fixture(scope="module")
def t1_law(tiny_vocab_dir):
    from test_lossless import SETTINGS
    return exact_laws(tiny_vocab_dir, {"t1": SETTINGS["t1"]})


@pytest.fixture(scope="module")
def tiny_drafter(tiny_vocab_dir, tmp_path_factory):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("tiny_drafter"), tiny_vocab_dir, block_size=8, std=0.3))


@pytest.mark.parametrize("verify", ["target-only", "rejection"])
def test_adaptive_widths_keep_sampling_exact(tiny_vocab_dir, tiny_drafter, t1_law, verify, monkeypatch):
    monkeypatch.setattr(SpecPolicy, "choose", cycling_choose)
    llm = spec_llm(tiny_vocab_dir, tiny_drafter, 8, verify)
    assert llm.engine.policy.widths == [1, 2, 4, 8]
    result = law_fit(llm, t1_law, "t1")
    assert result.p_value > ALPHA, f"{verify=}: chi2={result.statistic:.1f} dof={result.dof} p={result.p_value:.2e}"


def test_adaptive_widths_negative_control_biased_verifier_fails(tiny_vocab_dir, tiny_drafter, t1_law, monkeypatch):
    monkeypatch.setattr(SpecPolicy, "choose", cycling_choose)
    monkeypatch.setattr(step_module, "verify_tree", over_accepting_verify_tree)
    result = law_fit(spec_llm(tiny_vocab_dir, tiny_drafter, 8, "target-only"), t1_law, "t1")
    assert result.p_value < ALPHA, f"biased verifier passed: p={result.p_value:.3f}"


@pytest.mark.parametrize("spec", ["dflash", "ddtree"])
def test_eager_steps_run_the_chosen_width(qwen3_dir, tmp_path, spec, monkeypatch):
    """Drafting on the device happens inside the step: an eager step must draft at the width the
    policy chose, not the method's full width (the CPU engine once ran every step full width)."""
    drafter = write_dflash_drafter(tmp_path / "drafter", qwen3_dir, block_size=6)
    monkeypatch.setattr(SpecPolicy, "choose", lambda self, seqs: 4)
    llm = LLM(model=qwen3_dir, spec=spec, draft_model=str(drafter), budget=5 if spec == "ddtree" else None)
    out = llm.generate(prompts_for(512, [9], seed=4), SamplingParams(temperature=0.0, max_tokens=24,
                                                                     ignore_eos=True))[0]
    assert out.metrics.drafted_tokens == 3 * out.metrics.verify_steps       # width 4: three draft nodes
    assert out.metrics.accept_length <= 4


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_narrow_step_walks_only_its_own_levels(qwen3_dir, tmp_path, temperature, monkeypatch):
    """A step cut to width w verifies w − 1 levels, not the method's full depth: a plain step and
    a 2-wide chain of a 6-block drafter once walked all 6 levels (each level a pass over the
    vocabulary, so on the H100 the policy timed plain and narrow chains above the full block)."""
    walked = []
    for name in ("verify_tree", "verify_tree_greedy"):
        real = getattr(step_module, name)

        def spy(*args, real=real, name=name):
            result = real(*args)
            walked.append(result.committed.shape[1] - 1)
            return result
        monkeypatch.setattr(step_module, name, spy)
    drafter = write_dflash_drafter(tmp_path / "drafter", qwen3_dir, block_size=6)
    widths = itertools.cycle([1, 2])
    monkeypatch.setattr(SpecPolicy, "choose", lambda self, seqs: next(widths))
    llm = LLM(model=qwen3_dir, spec="dflash", draft_model=str(drafter), spec_verify="target-only")
    llm.generate(prompts_for(512, [9], seed=4), SamplingParams(temperature=temperature, max_tokens=12,
                                                               ignore_eos=True))
    assert walked and set(walked) == {0, 1}


@pytest.mark.parametrize("spec_verify", ["target-only", "rejection"])
def test_a_plain_step_draws_one_uniform_per_row(qwen3_dir, tmp_path, spec_verify, monkeypatch):
    """Width 1 reads one uniform per row (`uniforms_at`): the engine draws `[B, 1]`, a plain
    engine's layout; a wider step draws its whole layout. (The laws stay exact:
    test_adaptive_widths_keep_sampling_exact cycles through width 1.)"""
    drafter = write_dflash_drafter(tmp_path / "drafter", qwen3_dir, block_size=6)
    widths = itertools.cycle([1, 6])
    monkeypatch.setattr(SpecPolicy, "choose", lambda self, seqs: next(widths))
    llm = LLM(model=qwen3_dir, spec="dflash", draft_model=str(drafter), spec_verify=spec_verify)
    step = llm.engine.spec_step
    decode, decoding = [], []
    real, real_step = llm.engine._uniforms, llm.engine._decode_step
    monkeypatch.setattr(llm.engine, "_uniforms", lambda *a: (u := real(*a), decoding and decode.append(u))[0])
    monkeypatch.setattr(llm.engine, "_decode_step", lambda seqs: (decoding.append(1), real_step(seqs), decoding.clear())[1])
    llm.generate(prompts_for(512, [9, 7], seed=4), SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True))
    decode = [u for u in decode if len(u) == 2]       # (the batch's last steps may hold one row)
    plain, wide = decode[0::2], decode[1::2]
    assert plain and wide and step.uniforms_per_row > 1
    assert all(u.shape == (2, 1) and (u > 0).all() for u in plain)
    assert all(u.shape == (2, step.uniforms_per_row) and (u > 0).all() for u in wide)
    assert step.uniforms_at(6) == step.uniforms_per_row and step.uniforms_at(1) == 1
