"""Arguments and entry points of `blockspec train-target` and `blockspec train-drafter`.

`run_*` raise ValueError with a clear message on bad arguments (the main CLI turns that into
exit code 2) and return 0 on success.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from blockspec.train.data import DEFAULT_HELD_OUT_FRACTION

DEFAULT_TARGET_EPOCHS = 1.0
DEFAULT_DRAFTER_EPOCHS = 6.0  # the published recipe, docs/dflash.md


def _add_common(parser: argparse.ArgumentParser, *, lr: float, batch_size: int, weight_decay: float) -> None:
    g = parser.add_argument_group("training")
    g.add_argument("--data", required=True, help="sharegpt | sharegpt:FILE | text:FILE | jsonl:FILE (chats with "
                   "'messages'); FILE may be .gz")
    g.add_argument("--out", required=True, help="output directory (model, train_log.jsonl, loss_curve.png)")
    g.add_argument("--steps", type=int, default=None, help="optimizer steps (or use --epochs)")
    g.add_argument("--epochs", type=float, default=None, help="passes over the training split")
    g.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="as many steps as fit in this time, measured on the first batches")
    g.add_argument("--batch-size", type=int, default=batch_size, help="sequences per step")
    g.add_argument("--lr", type=float, default=lr, help="peak learning rate")
    g.add_argument("--warmup", type=float, default=0.04, help="warmup as a fraction of the steps")
    g.add_argument("--weight-decay", type=float, default=weight_decay)
    g.add_argument("--grad-clip", type=float, default=1.0)
    g.add_argument("--max-len", type=int, default=1024, help="tokens per training sequence")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    g.add_argument("--dtype", default="auto", help="autocast dtype: auto (bf16 on CUDA) | float32 | bfloat16")
    g.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps")
    g.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    g.add_argument("--eval-every", type=int, default=None, help="held-out metrics every N steps")
    g.add_argument("--eval-batches", type=int, default=8, help="held-out batches per evaluation")
    g.add_argument("--snapshot-steps", default=None, help="export the model at these steps, e.g. 100,500")
    g.add_argument("--snapshot-every", type=int, default=None, help="export the model every N steps")
    g.add_argument("--held-out-fraction", type=float, default=DEFAULT_HELD_OUT_FRACTION)
    g.add_argument("--limit", type=int, default=None, help="use only the first N chats/documents")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_train_target_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    _add_common(parser, lr=1e-3, batch_size=32, weight_decay=0.1)
    g = parser.add_argument_group("target model")
    g.add_argument("--tokenizer", default=None, help="use this directory's tokenizer instead of training one")
    g.add_argument("--vocab-size", type=int, default=8192, help="size of the BPE tokenizer to train")
    g.add_argument("--tokenizer-chars", type=int, default=None, help="train the tokenizer on this many characters")
    g.add_argument("--layers", type=int, default=8)
    g.add_argument("--hidden-size", type=int, default=256)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--kv-heads", type=int, default=2)
    g.add_argument("--head-dim", type=int, default=None)
    g.add_argument("--intermediate-size", type=int, default=1024)
    g.add_argument("--rope-theta", type=float, default=10000.0)
    g.add_argument("--loss-on", default="all", choices=("all", "assistant"),
                   help="tokens with loss: all (default, from-scratch LM) or assistant turns only")
    return parser


def add_train_drafter_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    _add_common(parser, lr=6e-4, batch_size=8, weight_decay=0.0)
    g = parser.add_argument_group("drafter")
    g.add_argument("--target", required=True, help="target model directory (frozen)")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--layers", type=int, default=2, help="drafter decoder layers")
    g.add_argument("--target-layer-ids", default=None, help="target layers to read, e.g. 1,5 (default: spaced)")
    g.add_argument("--intermediate-size", type=int, default=None, help="default: the target's")
    g.add_argument("--max-anchors", type=int, default=512, help="blocks per sequence")
    g.add_argument("--gamma", type=float, default=None, help="loss decay (default 7 for B=16, 5 for 10, 4 for 8)")
    g.add_argument("--init", default=None, help="start from this drafter's weights (fine-tune)")
    g.add_argument("--kl-weight", type=float, default=0.0, metavar="W",
                   help="loss (1-W)·CE(target tokens) + W·KL(p‖q) against the target's distribution p "
                        "over the block (default 0: CE only)")
    return parser


def _check_common(args) -> None:
    if sum(v is not None for v in (args.steps, args.epochs, args.time_budget)) > 1:
        raise ValueError("give one of --steps, --epochs and --time-budget")
    if args.time_budget is not None and args.time_budget <= 0:
        raise ValueError(f"--time-budget must be positive, got {args.time_budget}")
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be positive, got {args.steps}")
    if args.epochs is not None and args.epochs <= 0:
        raise ValueError(f"--epochs must be positive, got {args.epochs}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be positive, got {args.batch_size}")
    if args.lr <= 0:
        raise ValueError(f"--lr must be positive, got {args.lr}")
    if not 0 <= args.warmup < 1:
        raise ValueError(f"--warmup must be a fraction in [0, 1), got {args.warmup}")
    if args.grad_clip <= 0:
        raise ValueError(f"--grad-clip must be positive, got {args.grad_clip}")
    if args.weight_decay < 0:
        raise ValueError(f"--weight-decay must not be negative, got {args.weight_decay}")
    if not 0 <= args.held_out_fraction < 1:
        raise ValueError(f"--held-out-fraction must be in [0, 1), got {args.held_out_fraction}")
    if args.max_len < 2:
        raise ValueError(f"--max-len must be at least 2, got {args.max_len}")
    for name in ("save_every", "eval_every", "eval_batches", "limit", "snapshot_every"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")


def _settings_kwargs(args) -> dict:
    from blockspec.models.loader import parse_device
    from blockspec.train.loop import parse_int_list, resolve_autocast_dtype

    device = parse_device(args.device)
    snapshots = parse_int_list(args.snapshot_steps, "--snapshot-steps")
    if any(s < 1 for s in snapshots):
        raise ValueError("--snapshot-steps must be positive")
    return dict(lr=args.lr, warmup_fraction=args.warmup, weight_decay=args.weight_decay, device=device,
                autocast_dtype=resolve_autocast_dtype(args.dtype, device), grad_clip=args.grad_clip,
                save_every=args.save_every, eval_every=args.eval_every, snapshot_steps=snapshots,
                snapshot_every=args.snapshot_every, resume=args.resume, progress=not args.no_progress,
                time_budget_s=args.time_budget)


def _epochs(args, default: float) -> float | None:
    """--epochs, or the default when no other length (--steps, --time-budget) is given."""
    chosen = (args.epochs, args.steps, args.time_budget)
    return args.epochs if any(v is not None for v in chosen) else default


def run_train_target(args) -> int:
    from blockspec.train.loop import check_out_dir
    from blockspec.train.target import TargetRun, TargetShape, count_parameters, train_target

    _check_common(args)
    shape = TargetShape(num_layers=args.layers, hidden_size=args.hidden_size, num_heads=args.heads,
                        num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                        intermediate_size=args.intermediate_size, max_position_embeddings=args.max_len,
                        rope_theta=args.rope_theta)
    shape.validate()
    run = TargetRun(data=args.data, out_dir=Path(args.out), shape=shape, settings_kwargs=_settings_kwargs(args),
                    steps=args.steps, epochs=_epochs(args, DEFAULT_TARGET_EPOCHS), batch_size=args.batch_size,
                    seed=args.seed, loss_on=args.loss_on, tokenizer_dir=args.tokenizer, vocab_size=args.vocab_size,
                    tokenizer_chars=args.tokenizer_chars, held_out_fraction=args.held_out_fraction,
                    limit=args.limit, eval_batches=args.eval_batches)
    check_out_dir(run.out_dir, args.resume)
    result, model = train_target(run)
    print(f"train-target: {result.steps} steps, final loss {result.final_loss}, "
          f"{count_parameters(model) / 1e6:.1f}M parameters → {result.out_dir}")
    return 0


def run_train_drafter(args) -> int:
    from blockspec.train.loop import check_out_dir, parse_int_list
    from blockspec.train.drafter import DrafterRun, train_drafter

    _check_common(args)
    if not (Path(args.target) / "config.json").is_file():
        raise ValueError(f"--target {args.target}: not a model directory (no config.json)")
    run = DrafterRun(target_dir=args.target, data=args.data, out_dir=Path(args.out),
                     settings_kwargs=_settings_kwargs(args), block_size=args.block_size, num_layers=args.layers,
                     target_layer_ids=parse_int_list(args.target_layer_ids, "--target-layer-ids"),
                     intermediate_size=args.intermediate_size, max_anchors=args.max_anchors, gamma=args.gamma,
                     max_len=args.max_len, steps=args.steps, epochs=_epochs(args, DEFAULT_DRAFTER_EPOCHS),
                     batch_size=args.batch_size, seed=args.seed, held_out_fraction=args.held_out_fraction,
                     limit=args.limit, eval_batches=args.eval_batches, init_dir=args.init,
                     kl_weight=args.kl_weight)
    if args.gamma is not None and args.gamma <= 0:
        raise ValueError(f"--gamma must be positive, got {args.gamma}")
    if not 0 <= args.kl_weight <= 1:
        raise ValueError(f"--kl-weight must be in [0, 1], got {args.kl_weight}")
    check_out_dir(run.out_dir, args.resume)
    result, _ = train_drafter(run)
    print(f"train-drafter: {result.steps} steps, final loss {result.final_loss} → {result.out_dir}")
    return 0
