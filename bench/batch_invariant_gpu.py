"""Greedy speculative ≡ plain in bf16 on the GPU, with and without `--batch-invariant`.

For each model, plain / DFlash / DDTree greedy over 16 prompts at batch 16 (plus plain at batch 1
with the flag: batch invariance of plain decoding itself), counting prompts whose token ids
equal plain's and, where they differ, the first differing output position:

* the bundled pair (its trained drafter; CUDA graphs on, as served), 64 tokens;
* the Qwen3-8B shape with random weights (seed 0) and a random 5-layer drafter (block 16, DDTree
  budget 16), built in memory (`bench.step.random_target`), eager (no graph capture, to stay
  inside the device call), 32 tokens over random prompt ids.

    python bench/batch_invariant_gpu.py --output $OUT/equality.json [--only bundled|8b]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script from the repo root
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bundled_gpu import PROMPTS  # noqa: E402  (the 16 prompts of the bundled pair's GPU runs)

SPECS = ("none", "dflash", "ddtree")


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def compare(runs: dict[str, list[list[int]]]) -> dict:
    plain = runs["none_b16"]
    out = {}
    for name, ids in runs.items():
        diffs = [first_difference(a, b) for a, b in zip(ids, plain)]
        out[name] = {"equals_plain": sum(d is None for d in diffs), "prompts": len(ids),
                     "first_difference": [d for d in diffs if d is not None]}
    return out


def free() -> None:
    gc.collect()
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def bundled_runs(batch_invariant: bool, max_tokens: int) -> dict:
    from blockspec.llm import LLM
    from blockspec.sampling import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    runs = {}
    for spec in SPECS:
        for batch in ((16, 1) if spec == "none" and batch_invariant else (16,)):
            extra = {"budget": 16} if spec == "ddtree" else {}
            llm = LLM(spec=spec, device="cuda", dtype="bfloat16", max_running_requests=batch,
                      batch_invariant=batch_invariant, **extra)
            outs = []
            for i in range(0, len(chats), batch):
                outs += llm.chat(chats[i:i + batch], params)
            runs[f"{spec}_b{batch}"] = [list(o.token_ids) for o in outs]
            del llm
            free()
    return runs


def random_8b_runs(batch_invariant: bool, max_tokens: int, tmp: Path, shape: str = "qwen3-8b",
                   device: str = "cuda", dtype: str = "bfloat16") -> dict:
    """Engines over the random 8B shape: `load_target` and the drafter's load replaced by the
    step bench's random builders (same seeds every run, so every engine has the same weights)."""
    import torch
    import blockspec.engine.engine as engine_module
    from blockspec.bench.step import drafter_config, random_drafter, random_target, shape_config
    from blockspec.bundled import TARGET_DIR
    from blockspec.engine.config import EngineConfig
    from blockspec.models.registry import architecture_of
    from blockspec.sampling import SamplingParams
    from blockspec.speculative.proposers import DFlashProposer
    raw = shape_config(shape)
    model_dir = tmp / f"{shape}-random"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(raw))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TARGET_DIR / name, model_dir / name)
    cfg = architecture_of(raw).parse_config(raw)
    dcfg = drafter_config(cfg, 5, 16)
    real_load = engine_module.load_target
    engine_module.load_target = lambda d, dtype, device, backend=None, **kw: random_target(
        raw, getattr(torch, dtype), torch.device(device), backend)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.vocab_size, (int(n),), generator=gen).tolist()
               for n in torch.randint(16, 64, (16,), generator=gen)]
    runs = {}
    try:
        for spec in SPECS:
            proposer = None
            if spec != "none":
                proposer = DFlashProposer(dcfg, 16, 16 if spec == "ddtree" else None)
                proposer.load = (lambda p: lambda target, num_pages, page_size, backend: p.attach(
                    random_drafter(dcfg, getattr(torch, dtype), target.lm_head.weight.device, backend),
                    target, num_pages, page_size))(proposer)
            engine = engine_module.Engine(EngineConfig(
                model=str(model_dir), dtype=dtype, device=device, spec=spec, batch_invariant=batch_invariant,
                detokenize=False, max_running_requests=16, max_model_len=256, cuda_graph=False), proposer=proposer)
            for i, p in enumerate(prompts):
                engine.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
            got = {}
            while engine.has_unfinished_requests():
                for o in engine.step():
                    got.setdefault(o.request_id, []).extend(o.new_token_ids)
            runs[f"{spec}_b16"] = [got[f"r{i}"] for i in range(len(prompts))]
            del engine, proposer
            free()
    finally:
        engine_module.load_target = real_load
    return runs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", required=True)
    ap.add_argument("--only", choices=("bundled", "8b"), default=None)
    ap.add_argument("--bundled-tokens", type=int, default=64)
    ap.add_argument("--8b-tokens", dest="tokens_8b", type=int, default=32)
    args = ap.parse_args()
    result = {"bundled_tokens": args.bundled_tokens, "8b_tokens": args.tokens_8b}
    tmp = Path(tempfile.mkdtemp())
    for model in ("bundled", "8b"):
        if args.only not in (None, model):
            continue
        for flag in (False, True):
            start = time.perf_counter()
            try:
                runs = (bundled_runs(flag, args.bundled_tokens) if model == "bundled"
                        else random_8b_runs(flag, args.tokens_8b, tmp))
                row = compare(runs)
            except Exception as e:  # noqa: BLE001 - recorded, and the other runs go on
                row = {"error": f"{type(e).__name__}: {e}"}
                free()
            key = f"{model}_{'batch_invariant' if flag else 'default'}"
            result[key] = row
            result[key + "_seconds"] = time.perf_counter() - start
            print(key, json.dumps(row), f"{result[key + '_seconds']:.1f} s", flush=True)
            json.dump(result, open(args.output, "w"), indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
