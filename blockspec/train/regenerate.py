"""Regenerate chat responses with the target itself, as drafter training data.

A drafter learns to predict *the target*, so training on the target's own replies to the
training prompts (REFERENCE §1: "training on target-regenerated responses helps") matches
what it will be asked to draft. Held-out conversations are never used.

python -m blockspec.train.regenerate --target DIR --out FILE.jsonl [--num 8000 --batch 512
    --max-new-tokens 256 --temperatures 0,1 --device cuda]
writes one chat per line: {"id", "messages": [..., {"role": "assistant", "content": reply}]},
ready for `blockspec train-drafter --data jsonl:FILE.jsonl`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def regenerate(target: str, out: str, num: int, batch: int, max_new_tokens: int,
               temperatures: list[float], device: str, max_prompt_tokens: int = 256, seed: int = 0) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from blockspec.train.data import (DEFAULT_HELD_OUT_FRACTION, held_out_prompts, load_sharegpt,
                                      render_prompt, split_held_out)
    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16 if device.startswith("cuda")
                                                 else torch.float32).to(device).eval()
    train, _ = split_held_out(load_sharegpt(), DEFAULT_HELD_OUT_FRACTION)
    prompts = held_out_prompts(train)[:num]      # first-turn prompts of *training* chats
    eos = model.generation_config.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
    torch.manual_seed(seed)
    written = 0
    with open(out, "w") as f:
        for i in range(0, len(prompts), batch):
            chunk = prompts[i:i + batch]
            temp = temperatures[(i // batch) % len(temperatures)]
            ids = [render_prompt(tok, p.messages)[-max_prompt_tokens:] for p in chunk]
            width = max(map(len, ids))
            input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=device)
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
            with torch.no_grad():
                gen = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                     do_sample=temp > 0, temperature=temp if temp > 0 else None, top_k=0,
                                     top_p=1.0, eos_token_id=eos, pad_token_id=pad)
            for p, row in zip(chunk, gen[:, width:].tolist()):
                reply = tok.decode(row, skip_special_tokens=True).strip()
                if reply:
                    f.write(json.dumps({"id": f"{p.id}-t{temp:g}", "messages": list(p.messages) +
                                        [{"role": "assistant", "content": reply}]}) + "\n")
                    written += 1
            print(f"regenerate: {i + len(chunk)}/{len(prompts)} prompts (T={temp:g})", flush=True)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--num", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    n = regenerate(args.target, args.out, args.num, args.batch, args.max_new_tokens,
                   [float(t) for t in args.temperatures.split(",")], args.device)
    print(f"regenerate: wrote {n} chats to {Path(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
