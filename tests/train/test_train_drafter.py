"""train-drafter: the dense training forward is the engine's drafting function, training lowers
the loss, the drafter it writes runs losslessly in the engine, and resumption is exact."""

import argparse
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from blockspec import LLM, SamplingParams
from blockspec.attention.metadata import AttentionBatch, causal_new_mask, full_new_mask
from blockspec.config import ModelConfig
from blockspec.kv.cache import KVCache
from blockspec.models.dflash import load_drafter
from blockspec.models.loader import load_target
from blockspec.train import drafter as TD
from blockspec.train.cli import add_train_drafter_arguments, run_train_drafter
from blockspec.train.masks import block_input_ids, block_positions, block_targets, training_attention_mask
from fixtures import CORPUS

PAGE = 16


def paged_draft_logits(target, drafter, context: list[int], root: int) -> torch.Tensor:
    """The engine's drafting step for one request, done by hand: prefill `context` through the
    engine's target with feature capture, write the drafter's paged context cache, draft the
    block [root, MASK…] at positions len(context)… → logits of block positions 1…B−1."""
    cfg, dcfg = target.config, drafter.config
    a, B = len(context), dcfg.block_size
    num_pages = -(-(a + B) // PAGE) + 1
    pages = torch.arange(1, num_pages)[None]                    # page 0 is never allocated
    tcache = KVCache(cfg.num_layers, num_pages, PAGE, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu")
    dcache = KVCache(dcfg.num_layers, num_pages, PAGE, dcfg.num_kv_heads, dcfg.head_dim, torch.float32, "cpu")

    def slots(pos):
        return pages[0, pos // PAGE] * PAGE + pos % PAGE

    with torch.no_grad():
        pos = torch.arange(a)[None]
        prefill = AttentionBatch(slots(pos), pages, torch.tensor([0]), torch.tensor([a]), causal_new_mask(1, a, "cpu"))
        _, features = target(torch.tensor([context]), pos, tcache, prefill, dcfg.target_layer_ids)
        drafter.write_context(features, pos, prefill.slots, dcache)
        block = torch.tensor([[root] + [dcfg.mask_token_id] * (B - 1)])
        bpos = a + torch.arange(B)[None]
        draft = AttentionBatch(slots(bpos), pages, torch.tensor([a]), torch.tensor([B]), full_new_mask(1, B, "cpu"))
        hidden = drafter(target.embed(block), bpos, dcache, draft)
        return target.logits(hidden[:, 1:])[0]


def random_drafter(tmp_path, qwen3_dir, block_size=5, layer_ids=(0, 1)):
    target_cfg = ModelConfig.load(qwen3_dir)
    config = TD.drafter_config_dict(target_cfg, 2, block_size, target_cfg.vocab_size - 1, list(layer_ids))
    drafter = TD.build_drafter(config, seed=3)
    with torch.no_grad():  # lift weights off the init so that every parameter matters
        gen = torch.Generator().manual_seed(4)
        for p in drafter.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * (0.1 if p.ndim == 1 else 0.08))
    out = TD.save_drafter(drafter, config, tmp_path / "drafter")
    return load_drafter(out, target_cfg, torch.float32, torch.device("cpu")), config


def test_training_forward_is_the_engines_drafting_function(tmp_path, qwen3_dir):
    drafter, config = random_drafter(tmp_path, qwen3_dir)
    B = config["block_size"]
    engine_target = load_target(qwen3_dir)
    frozen = TD.FrozenTarget(AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32),
                             tuple(config["dflash_config"]["target_layer_ids"]))
    tokens = torch.randint(0, 500, (1, 15), generator=torch.Generator().manual_seed(0))
    anchors = torch.tensor([[1, 6, 12]])                        # 12: the block runs past the end
    blocks = TD.BlockBatch(anchors, torch.ones_like(anchors, dtype=torch.bool),
                           block_input_ids(tokens.gather(-1, anchors), B, config["dflash_config"]["mask_token_id"]),
                           block_positions(anchors, B), *block_targets(tokens, torch.ones_like(tokens), anchors, B),
                           training_attention_mask(anchors, B, tokens.shape[1]))
    with torch.no_grad():
        dense = TD.block_logits(drafter, frozen, tokens, blocks)[0]
    for n, a in enumerate(anchors[0].tolist()):
        ref = paged_draft_logits(engine_target, drafter, tokens[0, :a].tolist(), int(tokens[0, a]))
        torch.testing.assert_close(dense[n * B + 1:(n + 1) * B], ref, rtol=1e-4, atol=1e-4)


def drafter_args(tmp_path, target_dir, out_name, *extra):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    parser = add_train_drafter_arguments(argparse.ArgumentParser())
    return parser.parse_args([
        "--target", str(target_dir), "--data", f"text:{corpus}", "--out", str(tmp_path / out_name),
        "--block-size", "4", "--layers", "1", "--target-layer-ids", "0,1", "--max-len", "48",
        "--max-anchors", "12", "--held-out-fraction", "0", "--no-progress", "--device", "cpu", *extra])


def step_loss_lr(log):
    return [(r["step"], r["loss"], r["lr"]) for r in log]


def read_losses(out_dir):
    return [r for r in map(json.loads, (out_dir / "train_log.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.fixture(scope="module")
def overfit_run(tmp_path_factory, qwen3_dir):
    """One document (two windows, one batch, every anchor each step) seen 60 times."""
    tmp = tmp_path_factory.mktemp("train_drafter")
    args = drafter_args(tmp, qwen3_dir, "drafter", "--limit", "1", "--batch-size", "2", "--steps", "60",
                        "--lr", "1e-2", "--warmup", "0", "--max-anchors", "64", "--snapshot-steps", "10")
    assert run_train_drafter(args) == 0
    return tmp / "drafter"


def test_training_lowers_the_loss(overfit_run):
    losses = [r["loss"] for r in read_losses(overfit_run)]
    assert len(losses) == 60
    final = sum(losses[-5:]) / 5
    assert final < 0.7 * losses[0], losses
    # The first steps only unlearn predicting MASK (an untrained drafter echoes its input
    # embedding); the drop after them is the data being learnt.
    assert final < 0.6 * losses[9], losses


def test_written_drafter_is_zlab_format_and_runs_losslessly(overfit_run, qwen3_dir):
    cfg = json.loads((overfit_run / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["block_size"] == 4 and cfg["num_hidden_layers"] == 1 and cfg["num_target_layers"] == 2
    assert cfg["dflash_config"] == {"mask_token_id": 511, "target_layer_ids": [0, 1]}
    names = set(load_file(str(overfit_run / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight",
            "layers.0.self_attn.k_norm.weight", "layers.0.mlp.down_proj.weight",
            "layers.0.post_attention_layernorm.weight"} <= names
    load_drafter(overfit_run, ModelConfig.load(qwen3_dir), torch.float32, torch.device("cpu"))
    assert json.loads((overfit_run / "snapshots.json").read_text())[0]["step"] == 10
    load_drafter(overfit_run / "snapshots" / "step_10", ModelConfig.load(qwen3_dir), torch.float32,
                 torch.device("cpu"))

    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["The lighthouse keeper climbed", "In the spring the village"]
    plain = [o.token_ids for o in LLM(model=qwen3_dir).generate(prompts, params)]
    spec = LLM(model=qwen3_dir, spec="dflash", draft_model=str(overfit_run)).generate(prompts, params)
    assert [o.token_ids for o in spec] == plain


def test_resume_continues_exactly(tmp_path, qwen3_dir, monkeypatch):
    extra = ("--limit", "2", "--batch-size", "2", "--steps", "6", "--save-every", "3")
    assert run_train_drafter(drafter_args(tmp_path, qwen3_dir, "straight", *extra)) == 0
    straight = read_losses(tmp_path / "straight")

    calls = {"n": 0}
    real_loss = TD.drafter_loss

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # dies during step 5, after the checkpoint of step 3
            raise KeyboardInterrupt
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(TD, "drafter_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_train_drafter(drafter_args(tmp_path, qwen3_dir, "resumed", *extra))
    monkeypatch.setattr(TD, "drafter_loss", real_loss)
    with pytest.raises(ValueError, match="--resume"):
        run_train_drafter(drafter_args(tmp_path, qwen3_dir, "resumed", *extra))
    assert run_train_drafter(drafter_args(tmp_path, qwen3_dir, "resumed", *extra, "--resume")) == 0
    resumed = read_losses(tmp_path / "resumed")
    assert [r["step"] for r in resumed] == list(range(1, 7))
    assert step_loss_lr(resumed) == step_loss_lr(straight)  # bit for bit at every step
    a = load_file(str(tmp_path / "straight" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_kl_weight_trains_and_is_recorded(tmp_path, qwen3_dir):
    """--kl-weight 0.5: the run trains (the loss falls on the one repeated batch) and the
    checkpoint records the weight; --kl-weight 0 stays the CE run it always was."""
    extra = ("--limit", "1", "--batch-size", "2", "--steps", "12", "--lr", "1e-2", "--warmup", "0")
    assert run_train_drafter(drafter_args(tmp_path, qwen3_dir, "kl", *extra, "--kl-weight", "0.5")) == 0
    assert run_train_drafter(drafter_args(tmp_path, qwen3_dir, "ce", *extra)) == 0
    assert run_train_drafter(drafter_args(tmp_path, qwen3_dir, "ce0", *extra, "--kl-weight", "0")) == 0
    kl, ce = read_losses(tmp_path / "kl"), read_losses(tmp_path / "ce")
    assert kl[-1]["loss"] < 0.8 * kl[0]["loss"]
    assert step_loss_lr(read_losses(tmp_path / "ce0")) == step_loss_lr(ce)
    assert kl[0]["loss"] != ce[0]["loss"]
    state = torch.load(tmp_path / "kl" / "checkpoint" / "state.pt", weights_only=False)
    assert state["extra"]["kl_weight"] == 0.5


def test_bad_drafter_arguments(tmp_path, qwen3_dir):
    with pytest.raises(ValueError, match="block-size"):
        run_train_drafter(drafter_args(tmp_path, qwen3_dir, "x", "--block-size", "1", "--steps", "1"))
    with pytest.raises(ValueError, match="target layer ids"):
        run_train_drafter(drafter_args(tmp_path, qwen3_dir, "x", "--target-layer-ids", "0,7", "--steps", "1"))
    for bad in ("-0.5", "1.5"):
        with pytest.raises(ValueError, match="--kl-weight"):
            run_train_drafter(drafter_args(tmp_path, qwen3_dir, "x", "--kl-weight", bad, "--steps", "1"))
    no_mask = tmp_path / "no_mask"
    shutil.copytree(qwen3_dir, no_mask)
    tok = json.loads((no_mask / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] != "<|MASK|>"]
    (no_mask / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="MASK"):
        run_train_drafter(drafter_args(tmp_path, no_mask, "x", "--steps", "1"))
