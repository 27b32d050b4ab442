"""`blockspec bench offline` on the tiny Qwen3 with a random DFlash drafter (and n-gram)."""

from __future__ import annotations

import json

import pytest

from blockspec.bench.datasets import BenchPrompt
from blockspec.bench.offline import OfflineBenchConfig, prompt_token_ids, run_offline_bench
from bench_servers import run_cli
from dflash_fixtures import write_dflash_drafter

BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def drafter(qwen3_dir, tmp_path_factory):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("bench_drafter"), qwen3_dir, block_size=BLOCK_SIZE))


def test_offline_dflash_json_has_accept_length_acceptance_and_speedup(qwen3_dir, drafter, tmp_path, capsys):
    out = tmp_path / "offline.json"
    code = run_cli(["bench", "offline", "--model", qwen3_dir, "--draft-model", drafter, "--spec", "dflash",
                    "--dataset", "random,humaneval", "--num-prompts", "2", "--temperature", "0,1",
                    "--max-tokens", "6", "--random-input-len", "8", "--output", str(out), "--no-progress",
                    "--spec-policy", "static"])   # the full block every step: drafted = steps × (block − 1)
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["spec"] == "dflash" and doc["command"]
    assert {(r["dataset"], r["temperature"]) for r in doc["records"]} == {
        ("random", 0.0), ("random", 1.0), ("humaneval", 0.0), ("humaneval", 1.0)}
    for r in doc["records"]:
        assert r["num_prompts"] == 2 and r["algorithm"] == "dflash"
        assert r["spec"]["tok_s"] > 0 and r["plain"]["tok_s"] > 0
        assert r["speedup"] == pytest.approx(r["spec"]["tok_s"] / r["plain"]["tok_s"])
        assert r["verify_steps"] > 0 and r["accept_length"] >= 1
        assert len(r["acceptance_per_position"]) == BLOCK_SIZE - 1
        assert all(0 <= a <= 1 for a in r["acceptance_per_position"])
        assert r["drafted_tokens"] == r["verify_steps"] * (BLOCK_SIZE - 1)
    greedy = [r for r in doc["records"] if r["temperature"] == 0]
    assert all(r["greedy_match"] == 1.0 for r in greedy)  # speculation leaves greedy output unchanged
    assert "speedup" in capsys.readouterr().out


def test_offline_acceptance_per_position_is_counted_per_verify_step(qwen3_dir):
    """n-gram drafts on a looping greedy output: the per-position rates agree with the totals."""
    config = OfflineBenchConfig(model=qwen3_dir, spec="ngram", datasets=["random"], num_prompts=2,
                                temperatures=[0.0], batch_size=2, max_tokens=24, random_input_len=6,
                                ignore_eos=True, progress=False)
    (record,) = run_offline_bench(config)["records"]
    assert record["spec"]["output_tokens"] == record["plain"]["output_tokens"] == 48
    rates = record["acceptance_per_position"]
    assert rates == sorted(rates, reverse=True)  # position k accepted only after k-1
    assert sum(rates) * record["verify_steps"] == pytest.approx(record["accepted_tokens"])
    assert record["accept_length"] > 1


def test_prompt_token_ids_cut_to_length_and_limit(qwen3_dir):
    from blockspec.tokenizer import Tokenizer
    tok = Tokenizer.load(qwen3_dir)
    random_prompt = BenchPrompt("the harbour market " * 20, chat=False, output_len=4, input_len=5)
    assert len(prompt_token_ids(random_prompt, tok, 100)) == 5
    chat = BenchPrompt("hello there " * 50, chat=True)
    ids = prompt_token_ids(chat, tok, 16)
    full = tok.apply_chat_template(chat.messages(), add_generation_prompt=True)
    assert ids == list(full[-16:])  # the end kept: the generation prompt survives


def test_spec_none_is_a_usage_error(qwen3_dir):
    with pytest.raises(ValueError, match="must not be none"):
        run_cli(["bench", "offline", "--model", qwen3_dir, "--spec", "none", "--dataset", "random"])
