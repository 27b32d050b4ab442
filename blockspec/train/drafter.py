"""`train-drafter`: a DFlash drafter trained against a frozen target (docs/dflash.md, Training).

The trained module is `blockspec.models.dflash.DFlashDrafter` itself, so the weights written
are exactly those the engine loads. Only the forward differs: instead of the engine's paged
drafting of one block per request, `dense_block_hidden` runs all blocks of a batch in one
dense attention over [fused context of all T positions ‖ all block tokens], with the mask of
`masks.training_attention_mask` keeping blocks apart. A block thus computes the same function
as the engine's drafting step with context = the tokens before its anchor.

The target is frozen and computes its hidden states online (transformers' forward with
output_hidden_states; layer id i = hidden_states[i + 1], which for the last layer is the
final-normed state, as the engine captures it too); its embedding embeds the block
tokens and its LM head turns the drafter's output into logits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from blockspec.attention.reference import masked_attention
from blockspec.config import ModelConfig
from blockspec.models.dflash import DFlashConfig, DFlashDrafter, default_target_layer_ids
from blockspec.train.loop import TrainSettings, batch_indices, resolve_total_steps, step_seed, train
from blockspec.train import data as D
from blockspec.train.distill import block_distill_loss, check_kl_weight, teacher_block_logits
from blockspec.train.masks import (block_input_ids, block_positions, block_targets, sample_anchors,
                                   training_attention_mask)

# Loss decay γ at the block sizes the published recipe names (docs/dflash.md); others are interpolated.
GAMMA_BY_BLOCK_SIZE = ((8, 4.0), (10, 5.0), (16, 7.0))
DEFAULT_MAX_ANCHORS = 512
INIT_STD = 0.02


def loss_decay_gamma(block_size: int) -> float:
    """γ for exp(−(k−1)/γ): 4 for B = 8, 5 for 10, 7 for 16; piecewise linear elsewhere
    (extended with the slope of the nearest segment)."""
    points = GAMMA_BY_BLOCK_SIZE
    if block_size <= points[1][0]:
        (x0, y0), (x1, y1) = points[0], points[1]
    else:
        (x0, y0), (x1, y1) = points[1], points[2]
    gamma = y0 + (block_size - x0) * (y1 - y0) / (x1 - x0)
    return max(gamma, 0.5)


def position_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """Loss weight of each block position: 0 at k = 0 (the anchor), exp(−(k−1)/γ) for k ≥ 1."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    weights = torch.exp(-(k - 1) / gamma)
    weights[0] = 0.0
    return weights


# ---- the drafter's config and weights ------------------------------------------------------------

def drafter_config_dict(target: ModelConfig, num_layers: int, block_size: int, mask_token_id: int,
                        target_layer_ids: list[int] | None = None,
                        intermediate_size: int | None = None) -> dict:
    """config.json of a drafter for `target`, in z-lab's format."""
    if num_layers < 1:
        raise ValueError(f"--layers must be positive, got {num_layers}")
    if block_size < 2:
        raise ValueError(f"--block-size must be at least 2, got {block_size}")
    ids = list(target_layer_ids) if target_layer_ids else default_target_layer_ids(target.num_layers, num_layers)
    bad = [i for i in ids if not 0 <= i < target.num_layers]
    if bad:
        raise ValueError(f"target layer ids {bad} are outside the target's {target.num_layers} layers")
    rope = target.rope
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": block_size,
        "num_target_layers": target.num_layers,
        "num_hidden_layers": num_layers,
        "hidden_size": target.hidden_size,
        "intermediate_size": intermediate_size or target.intermediate_size,
        "num_attention_heads": target.num_heads,
        "num_key_value_heads": target.num_kv_heads,
        "head_dim": target.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": rope.theta,
        "rope_scaling": None,
        "vocab_size": target.vocab_size,
        "max_position_embeddings": target.max_position_embeddings,
        "tie_word_embeddings": False,
        "dflash_config": {"mask_token_id": int(mask_token_id), "target_layer_ids": [int(i) for i in ids]},
    }
    if rope.rope_type != "default":
        cfg["rope_scaling"] = {"rope_type": rope.rope_type, "factor": rope.factor,
                               "low_freq_factor": rope.low_freq_factor, "high_freq_factor": rope.high_freq_factor,
                               "original_max_position_embeddings": rope.original_max_position_embeddings}
    return cfg


def build_drafter(config: dict, seed: int) -> DFlashDrafter:
    """A fresh DFlashDrafter: linears N(0, 0.02), norms 1 (seeded, global RNG untouched)."""
    drafter = DFlashDrafter(DFlashConfig.from_hf(config))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in drafter.named_parameters():
            if param.ndim == 1:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * INIT_STD)
    return drafter


def save_drafter(drafter: DFlashDrafter, config: dict, out_dir: str | Path) -> Path:
    """config.json + model.safetensors (float32) under z-lab's names."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in drafter.state_dict().items()
             if "rotary" not in k}
    save_file(state, str(out / "model.safetensors"))
    return out


# ---- the frozen target ---------------------------------------------------------------------------

class FrozenTarget:
    """A transformers causal LM with gradients off: features, embeddings and LM head."""

    def __init__(self, hf_model: nn.Module, layer_ids: tuple[int, ...]):
        self.model = hf_model.eval().requires_grad_(False)
        self.layer_ids = tuple(layer_ids)

    @property
    def embedding(self) -> nn.Module:
        return self.model.get_input_embeddings()

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor, with_final: bool = False):
        """Hidden states after decoder layers `layer_ids`, concatenated: `[B, T, K·H]`; with_final:
        also the final-normed states `[B, T, H]` (the LM head turns them into the target's logits)."""
        decoder = getattr(self.model, self.model.base_model_prefix)
        out = decoder(input_ids=input_ids, output_hidden_states=True, use_cache=False)
        features = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        return (features, out.last_hidden_state) if with_final else features

    @torch.no_grad()
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(input_ids)


def load_frozen_target(target_dir: str | Path, layer_ids, device) -> FrozenTarget:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    return FrozenTarget(model.to(device), layer_ids)


# ---- the dense training forward ------------------------------------------------------------------

def check_trainable_layout(cfg: DFlashConfig) -> None:
    """The dense forward implements full bidirectional block attention only."""
    for i in range(cfg.num_layers):
        window, causal = cfg.layer_window(i)
        if window is not None or causal:
            raise ValueError(f"drafter layer {i} uses sliding-window or causal attention, which training "
                             "does not implement")


def dense_block_hidden(drafter: DFlashDrafter, context_features: torch.Tensor, block_embeds: torch.Tensor,
                       block_pos: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """All blocks of a batch in one pass → the drafter's normed hidden states `[Bs, Q, H]`.

    context_features `[Bs, T, K·H]` (target features of every position, at positions 0…T−1);
    block_embeds `[Bs, Q, H]` and block_pos `[Bs, Q]` (Q = N·B block tokens);
    visible `[Bs, Q, T + Q]` (see masks.training_attention_mask).
    Per layer: K/V = [that layer's k/v projections of the fused context ‖ of the block tokens].
    """
    batch, seq_len = context_features.shape[:2]
    ctx = drafter.fuse(context_features.to(drafter.fc.weight.dtype))
    ctx_pos = torch.arange(seq_len, device=ctx.device).expand(batch, seq_len)
    ctx_cos, ctx_sin = drafter.rotary(ctx_pos, ctx.dtype)
    x = block_embeds
    cos, sin = drafter.rotary(block_pos, x.dtype)
    mask = visible[:, None]
    for layer in drafter.layers:
        ctx_k, ctx_v = layer.self_attn.project_kv(ctx, ctx_cos, ctx_sin)

        def attend(q, blk_k, blk_v, ctx_k=ctx_k, ctx_v=ctx_v, scale=layer.self_attn.scale):
            keys = torch.cat([ctx_k, blk_k.to(ctx_k.dtype)], dim=1)
            values = torch.cat([ctx_v, blk_v.to(ctx_v.dtype)], dim=1)
            return masked_attention(q, keys, values, mask, scale)

        x = layer(x, cos, sin, attend)
    return drafter.norm(x)


@dataclass
class BlockBatch:
    """One batch's blocks: anchors `[Bs, N]` and their validity, block inputs and targets `[Bs, N·B]`."""
    anchors: torch.Tensor
    anchor_valid: torch.Tensor
    block_ids: torch.Tensor
    block_pos: torch.Tensor
    targets: torch.Tensor
    trained: torch.Tensor
    visible: torch.Tensor


def make_block_batch(input_ids: torch.Tensor, loss_mask: torch.Tensor, block_size: int, mask_token_id: int,
                     max_anchors: int, generator: torch.Generator) -> BlockBatch:
    """Sample anchors (on CPU, from the generator) and lay out blocks, targets and mask."""
    anchors, valid = sample_anchors(loss_mask.cpu(), max_anchors, generator)
    anchors, valid = anchors.to(input_ids.device), valid.to(input_ids.device)
    anchor_tokens = input_ids.gather(-1, anchors)
    targets, trained = block_targets(input_ids, loss_mask, anchors, block_size, valid)
    return BlockBatch(anchors, valid, block_input_ids(anchor_tokens, block_size, mask_token_id),
                      block_positions(anchors, block_size), targets, trained,
                      training_attention_mask(anchors, block_size, input_ids.shape[-1]))


def block_hidden(drafter: DFlashDrafter, target: FrozenTarget, input_ids: torch.Tensor,
                 blocks: BlockBatch) -> torch.Tensor:
    """The frozen target's features and embeddings through the dense drafter forward `[Bs, Q, H]`."""
    return dense_block_hidden(drafter, target.features(input_ids), target.embed(blocks.block_ids),
                              blocks.block_pos, blocks.visible)


def block_logits(drafter: DFlashDrafter, target: FrozenTarget, input_ids: torch.Tensor,
                 blocks: BlockBatch) -> torch.Tensor:
    """Drafter logits at every block token `[Bs, Q, V]` (for tests and small batches)."""
    hidden = block_hidden(drafter, target, input_ids, blocks)
    return F.linear(hidden, target.lm_head_weight.to(hidden.dtype))


def drafter_loss(drafter: DFlashDrafter, target: FrozenTarget, input_ids: torch.Tensor,
                 blocks: BlockBatch, block_size: int, gamma: float, with_accept: bool = False,
                 kl_weight: float = 0.0):
    """Weighted loss over trained block positions: Σ w_k·[(1 − W)·CE + W·KL(p‖q)] / Σ w_k
    (distill.block_distill_loss; W = kl_weight, 0 = plain CE against the data's tokens).

    Logits are computed only where a position is trained (most of a 512-block batch is).
    with_accept: also return the mean number of leading block positions whose argmax is the
    data's next token, + 1 — an accept length against the data (not the target's outputs).
    """
    if kl_weight > 0:
        features, final = target.features(input_ids, with_final=True)
    else:
        features, final = target.features(input_ids), None
    hidden = dense_block_hidden(drafter, features, target.embed(blocks.block_ids), blocks.block_pos, blocks.visible)
    weights = position_weights(block_size, gamma, input_ids.device).repeat(blocks.block_ids.shape[-1] // block_size)
    trained = blocks.trained
    lm_head = target.lm_head_weight.to(hidden.dtype)
    logits = F.linear(hidden[trained], lm_head)
    teacher = None if final is None else teacher_block_logits(final, blocks.block_pos, trained, lm_head)
    loss = block_distill_loss(logits, blocks.targets[trained], weights.expand_as(trained)[trained], teacher, kl_weight)
    if not with_accept:
        return loss
    correct = torch.zeros_like(trained)
    correct[trained] = logits.argmax(-1) == blocks.targets[trained]
    per_block = correct.unflatten(-1, (-1, block_size))[..., 1:].long().cumprod(-1).sum(-1)
    accept = (per_block.float()[blocks.anchor_valid] + 1).mean()
    return loss, accept


# ---- the command ---------------------------------------------------------------------------------

@dataclass
class DrafterRun:
    target_dir: str
    data: str
    out_dir: Path
    settings_kwargs: dict
    block_size: int = 16
    num_layers: int = 2
    target_layer_ids: tuple[int, ...] = ()
    intermediate_size: int | None = None
    max_anchors: int = DEFAULT_MAX_ANCHORS
    gamma: float | None = None
    max_len: int = 1024
    steps: int | None = None
    epochs: float | None = None
    batch_size: int = 8
    seed: int = 0
    held_out_fraction: float = D.DEFAULT_HELD_OUT_FRACTION
    limit: int | None = None
    eval_batches: int = 8
    init_dir: str | None = None       # start from this drafter's weights (fine-tuning)
    kl_weight: float = 0.0            # W of (1 − W)·CE + W·KL(p‖q) (distill.py)


def init_from(drafter: DFlashDrafter, config: dict, init_dir: str | Path) -> None:
    """Copy an existing drafter's weights; its config must describe the same drafter."""
    from blockspec.models.loader import load_state_dict

    other = json.loads((Path(init_dir) / "config.json").read_text())
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size"):
        if other.get(key) != config.get(key):
            raise ValueError(f"--init {init_dir}: {key} is {other.get(key)}, this run needs {config.get(key)}")
    if other["dflash_config"]["target_layer_ids"] != config["dflash_config"]["target_layer_ids"]:
        raise ValueError(f"--init {init_dir}: target_layer_ids differ from this run's")
    state = {k.removeprefix("model."): v for k, v in load_state_dict(init_dir).items()}
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary" not in k]
    if missing or unexpected:
        raise ValueError(f"--init {init_dir}: weights do not match (missing {missing[:3]}, extra {unexpected[:3]})")


def target_mask_token_id(target_dir: str | Path) -> tuple[int, object]:
    """The `<|MASK|>` id of the target's tokenizer (and the transformers tokenizer)."""
    from blockspec.tokenizer import MASK_TOKEN, Tokenizer

    tok = Tokenizer.load(target_dir)
    if tok.mask_token_id is None:
        raise ValueError(f"the target tokenizer in {target_dir} has no {MASK_TOKEN} token; a DFlash drafter "
                         "needs one for its block placeholders")
    return tok.mask_token_id, tok.hf_tokenizer


def drafter_windows(hf_tokenizer, items, max_len: int, progress: bool) -> list[D.Example]:
    return D.window_examples(D.tokenize_items(hf_tokenizer, items, progress), max_len)


def train_drafter(run: DrafterRun):
    """Train and write the drafter into run.out_dir; returns (TrainResult, drafter)."""
    if run.max_anchors < 1:
        raise ValueError(f"--max-anchors must be positive, got {run.max_anchors}")
    if run.max_len < 2:
        raise ValueError(f"--max-len must be at least 2, got {run.max_len}")
    check_kl_weight(run.kl_weight)
    settings_kwargs = dict(run.settings_kwargs)
    progress = settings_kwargs.get("progress", True)
    device = settings_kwargs["device"]
    target_cfg = ModelConfig.load(run.target_dir)
    mask_id, hf_tok = target_mask_token_id(run.target_dir)
    config = drafter_config_dict(target_cfg, run.num_layers, run.block_size, mask_id,
                                 list(run.target_layer_ids) or None, run.intermediate_size)
    max_len = min(run.max_len, target_cfg.max_position_embeddings)
    corpus = D.load_corpus(run.data, run.held_out_fraction, run.limit)
    train_windows = drafter_windows(hf_tok, corpus.train, max_len, progress)
    held_windows = drafter_windows(hf_tok, corpus.held_out, max_len, False)
    if not train_windows:
        raise ValueError(f"--data {run.data}: no response tokens to train on")
    target = load_frozen_target(run.target_dir, config["dflash_config"]["target_layer_ids"], device)
    drafter = build_drafter(config, run.seed)
    if run.init_dir:
        init_from(drafter, config, run.init_dir)
    drafter = drafter.to(device)
    check_trainable_layout(drafter.config)
    gamma = run.gamma if run.gamma is not None else loss_decay_gamma(run.block_size)
    pad_id = D.separator_id(hf_tok)
    total = resolve_total_steps(run.steps, run.epochs, len(train_windows), run.batch_size,
                                settings_kwargs.get("time_budget_s"))
    settings = TrainSettings(out_dir=run.out_dir, total_steps=total, description="train-drafter",
                             extra={"gamma": gamma, "kl_weight": run.kl_weight, "config": config}, **settings_kwargs)

    def loss_of(windows, generator, with_accept=False):
        ids, mask = D.collate(windows, pad_id)
        ids, mask = ids.to(device), mask.to(device)
        blocks = make_block_batch(ids, mask, run.block_size, mask_id, run.max_anchors, generator)
        return drafter_loss(drafter, target, ids, blocks, run.block_size, gamma, with_accept, run.kl_weight)

    def batch_loss(step: int) -> torch.Tensor:
        picked = [train_windows[i] for i in batch_indices(step, run.batch_size, len(train_windows), run.seed)]
        return loss_of(picked, torch.Generator().manual_seed(step_seed(run.seed, step, stream=2)))

    def evaluate() -> dict:
        gen = torch.Generator().manual_seed(step_seed(run.seed, 0, stream=3))  # same anchors every time
        losses, accepts = [], []
        for i in range(0, min(len(held_windows), run.eval_batches * run.batch_size), run.batch_size):
            loss, accept = loss_of(held_windows[i:i + run.batch_size], gen, with_accept=True)
            losses.append(float(loss))
            accepts.append(float(accept))
        return {"loss": sum(losses) / len(losses), "accept_len": sum(accepts) / len(accepts)}

    result = train(settings, drafter, batch_loss, lambda d: save_drafter(drafter, config, d),
                   evaluate if held_windows else None)
    return result, drafter

