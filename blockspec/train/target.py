"""`train-target`: a small Qwen3 trained from scratch with next-token cross-entropy.

The training forward is transformers' `Qwen3ForCausalLM` (the reference implementation; the
engine's forward is blockspec's own). The output directory is a Hugging Face checkpoint
(config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json) that transformers and `blockspec.LLM(model=DIR)` both load.

Loss is on every token by default ("all"): a model trained from scratch has to learn the
language first, and the user turns add about a third more text to ShareGPT's replies (27%
of its tokens); the drafter is trained on assistant tokens only regardless. `loss_on="assistant"` restricts it to replies.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from blockspec.train.loop import TrainSettings, batch_indices, train
from blockspec.train import data as D
from blockspec.train import tokenizer_train as TT

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
LOSS_MODES = ("all", "assistant")


@dataclass(frozen=True)
class TargetShape:
    """Sizes of the target. The defaults make ~10M parameters at vocabulary 8192."""
    num_layers: int = 8
    hidden_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int | None = None
    intermediate_size: int = 1024
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0

    def validate(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "intermediate_size",
                     "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"heads ({self.num_heads}) must be a multiple of kv heads ({self.num_kv_heads})")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden size {self.hidden_size} is not divisible by {self.num_heads} heads; "
                             "give --head-dim")
        if (self.head_dim or self.hidden_size // self.num_heads) % 2:
            raise ValueError("head_dim must be even (RoPE)")


def qwen3_config(shape: TargetShape, vocab_size: int, eos_token_ids: list[int], pad_token_id: int | None):
    """transformers' Qwen3Config for the shape, with tied embeddings."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim or shape.hidden_size // shape.num_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        tie_word_embeddings=True,
        eos_token_id=eos_token_ids if len(eos_token_ids) > 1 else eos_token_ids[0],
        pad_token_id=pad_token_id,
        bos_token_id=None,
        use_cache=False,
    )


def build_target(shape: TargetShape, vocab_size: int, eos_token_ids: list[int], pad_token_id: int | None,
                 seed: int):
    """A freshly initialised Qwen3ForCausalLM (transformers' init, seeded)."""
    from transformers import Qwen3ForCausalLM

    shape.validate()
    config = qwen3_config(shape, vocab_size, eos_token_ids, pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(config)


def count_parameters(model) -> int:
    """Parameters, tied ones counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def next_token_loss(model, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting token t+1 at position t, over targets with loss."""
    logits = model(input_ids=input_ids, use_cache=False).logits
    targets = input_ids[:, 1:].masked_fill(~loss_mask[:, 1:], -100)
    if not bool(loss_mask[:, 1:].any()):
        return logits.sum() * 0.0  # a batch without targets (possible with assistant-only loss)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


# ---- tokenizer -----------------------------------------------------------------------------------

def copy_tokenizer(src_dir: Path, out_dir: Path) -> None:
    for name in TOKENIZER_FILES:
        if (Path(src_dir) / name).is_file():
            shutil.copyfile(Path(src_dir) / name, Path(out_dir) / name)


def prepare_tokenizer(out_dir: Path, corpus: D.Corpus, tokenizer_dir: str | None, vocab_size: int,
                      max_len: int, max_chars: int | None, resume: bool, progress: bool):
    """The run's tokenizer, saved in out_dir: the one already there when resuming, a given one,
    or a BPE trained on the training split. Returns transformers' tokenizer."""
    from transformers import AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    if resume and (out_dir / "tokenizer.json").is_file():
        pass
    elif tokenizer_dir is not None:
        if not (Path(tokenizer_dir) / "tokenizer.json").is_file():
            raise ValueError(f"--tokenizer {tokenizer_dir}: no tokenizer.json there")
        copy_tokenizer(Path(tokenizer_dir), out_dir)
    else:
        TT.train_tokenizer(corpus.train, out_dir, vocab_size, max_len, max_chars, show_progress=progress)
    return AutoTokenizer.from_pretrained(str(out_dir))


def eos_ids(hf_tokenizer) -> list[int]:
    """<|im_end|> and <|endoftext|> when present (a chat reply or a document may end either way)."""
    vocab = hf_tokenizer.get_vocab()
    ids = [vocab[t] for t in (TT.IM_END, TT.ENDOFTEXT) if t in vocab]
    if hf_tokenizer.eos_token_id is not None and hf_tokenizer.eos_token_id not in ids:
        ids.append(int(hf_tokenizer.eos_token_id))
    if not ids:
        raise ValueError("the tokenizer has no end-of-sequence token")
    return ids


# ---- export --------------------------------------------------------------------------------------

def export_target(model, out_dir: Path, tokenizer_src: Path) -> None:
    """save_pretrained (float32 safetensors, config.json, generation_config.json) + tokenizer."""
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    cfg = model.config
    GenerationConfig(eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id,
                     bos_token_id=None).save_pretrained(out_dir)
    if Path(tokenizer_src).resolve() != out_dir.resolve():
        copy_tokenizer(tokenizer_src, out_dir)


# ---- the command ---------------------------------------------------------------------------------

@dataclass
class TargetRun:
    data: str
    out_dir: Path
    shape: TargetShape
    settings_kwargs: dict
    steps: int | None = None
    epochs: float | None = None
    batch_size: int = 32
    seed: int = 0
    loss_on: str = "all"
    tokenizer_dir: str | None = None
    vocab_size: int = TT.DEFAULT_VOCAB_SIZE
    tokenizer_chars: int | None = None
    held_out_fraction: float = D.DEFAULT_HELD_OUT_FRACTION
    limit: int | None = None
    eval_batches: int = 8


def tokenized_windows(hf_tokenizer, items, max_len: int, loss_on: str, progress: bool) -> list[D.Example]:
    examples = D.tokenize_items(hf_tokenizer, items, progress)
    if loss_on == "all":
        examples = D.with_full_loss(examples)
    return D.pack_examples(examples, max_len)


def train_target(run: TargetRun):
    """Train and write the target into run.out_dir; returns (TrainResult, model)."""
    from blockspec.train.loop import resolve_total_steps

    if run.loss_on not in LOSS_MODES:
        raise ValueError(f"--loss-on must be one of {', '.join(LOSS_MODES)}, got {run.loss_on!r}")
    settings_kwargs = dict(run.settings_kwargs)
    progress = settings_kwargs.get("progress", True)
    max_len = run.shape.max_position_embeddings
    corpus = D.load_corpus(run.data, run.held_out_fraction, run.limit)
    hf_tok = prepare_tokenizer(run.out_dir, corpus, run.tokenizer_dir, run.vocab_size, max_len,
                               run.tokenizer_chars, settings_kwargs.get("resume", False), progress)
    train_windows = tokenized_windows(hf_tok, corpus.train, max_len, run.loss_on, progress)
    held_windows = tokenized_windows(hf_tok, corpus.held_out, max_len, run.loss_on, False)
    if not train_windows:
        raise ValueError(f"--data {run.data}: no training tokens")
    ends = eos_ids(hf_tok)
    pad_id = hf_tok.pad_token_id if hf_tok.pad_token_id is not None else ends[0]
    device = settings_kwargs["device"]
    model = build_target(run.shape, len(hf_tok), ends, pad_id, run.seed).to(device)
    total = resolve_total_steps(run.steps, run.epochs, len(train_windows), run.batch_size,
                                settings_kwargs.get("time_budget_s"))
    settings = TrainSettings(out_dir=run.out_dir, total_steps=total, description="train-target",
                             extra={"parameters": count_parameters(model), "loss_on": run.loss_on},
                             **settings_kwargs)

    def batch_loss(step: int) -> torch.Tensor:
        picked = [train_windows[i] for i in batch_indices(step, run.batch_size, len(train_windows), run.seed)]
        ids, mask = D.collate(picked, pad_id)
        return next_token_loss(model, ids.to(device), mask.to(device))

    def evaluate() -> dict:
        batches = [held_windows[i:i + run.batch_size] for i in range(0, len(held_windows), run.batch_size)]
        losses = []
        for batch in batches[:run.eval_batches]:
            ids, mask = D.collate(batch, pad_id)
            losses.append(float(next_token_loss(model, ids.to(device), mask.to(device))))
        return {"loss": sum(losses) / len(losses)}

    result = train(settings, model, batch_loss, lambda d: export_target(model, d, run.out_dir),
                   evaluate if held_windows else None)
    return result, model
