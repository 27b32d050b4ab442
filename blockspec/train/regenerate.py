"""Regenerate chat responses with the target itself, as drafter training data.

A drafter learns to predict *the target*, so training on the target's own replies to the
training prompts matches what it will be asked to draft (docs/dflash.md, Training).
Held-out conversations are never used.

python -m blockspec.train.regenerate --target DIR --out FILE.jsonl [--data sharegpt
    --prompts first|all --num 8000 --temperatures 0,0.6:0.95,1 --batch 512 --max-new-tokens 256
    --shard K/N --device cuda --dtype float32]
makes one pass over the prompts per temperature (an item T:TOP_P also sets top_p) and writes
one chat per line:
{"id": "<chat id>[:u<turn>]:t<T>[p<TOP_P>]", "messages": [..., {"role": "assistant", "content": reply}]},
ready for `blockspec train-drafter --data jsonl:FILE.jsonl`. Shards split the prompt list so
that several processes can share one GPU (each is bound by its host thread at these sizes).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' → (K, N) with 0 ≤ K < N."""
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard must be K/N, got {text!r}") from None
    if n < 1 or not 0 <= k < n:
        raise ValueError(f"--shard must be K/N with 0 <= K < N, got {text!r}")
    return k, n


def parse_temperatures(text: str, flag: str = "--temperatures", default_top_p: float = 1.0
                       ) -> list[tuple[float, float]]:
    """'0,0.6:0.95,1' → [(0, 1), (0.6, 0.95), (1, 1)]: items T or T:TOP_P, T ≥ 0 and
    0 < TOP_P ≤ 1; an item without TOP_P takes `default_top_p` (greedy items always 1);
    a TOP_P on T = 0 is refused (greedy decoding has no nucleus)."""
    items = []
    for item in text.split(","):
        t_text, sep, p_text = item.strip().partition(":")
        try:
            temp = float(t_text)
            top_p = float(p_text) if sep else (default_top_p if temp > 0 else 1.0)
        except ValueError:
            raise ValueError(f"{flag} items must be T or T:TOP_P numbers, got {item!r} in {text!r}") from None
        if not temp >= 0 or temp == float("inf"):
            raise ValueError(f"{flag}: temperature must be a finite number >= 0, got {item!r}")
        if not 0 < top_p <= 1:
            raise ValueError(f"{flag}: top_p must be in (0, 1], got {item!r}")
        if temp == 0 and sep:
            raise ValueError(f"{flag}: {item!r} gives top_p to greedy decoding (T=0), which has none")
        items.append((temp, top_p))
    return items


def sample_tag(temp: float, top_p: float) -> str:
    """The id suffix of a reply: 't0', 't1', 't0.6p0.95'."""
    return f"t{temp:g}" + (f"p{top_p:g}" if top_p < 1 else "")


def training_prompts(data: str, which: str, num: int | None):
    """Prompts from the training side of the data's split: the first user turn of each chat,
    or every user turn ('all', with the chat before it as context)."""
    from blockspec.train.data import (DEFAULT_HELD_OUT_FRACTION, first_turn_prompts, load_corpus,
                                      user_turn_prompts)
    if which not in ("first", "all"):
        raise ValueError(f"--prompts must be first or all, got {which!r}")
    corpus = load_corpus(data, DEFAULT_HELD_OUT_FRACTION)
    if not corpus.is_chat:
        raise ValueError(f"--data {data}: regeneration needs chats, not plain text")
    if which == "first":
        prompts = first_turn_prompts(corpus.train)
    else:
        prompts = [p for c in corpus.train for p in user_turn_prompts(c)]
    return prompts[:num]


def fit_prompt(tok, messages, max_tokens: int) -> tuple[tuple[dict, ...], list[int]]:
    """The prompt shortened to at most `max_tokens` rendered tokens, as messages and their
    rendered ids: the oldest turns are dropped (the kept part starts with a system or user turn),
    and a single turn that is still too long keeps its end. The chat written out is then exactly
    what the target saw."""
    from blockspec.train.data import render_prompt

    def drop_oldest(msgs):
        msgs = msgs[1:]
        while len(msgs) > 1 and msgs[0]["role"] == "assistant":
            msgs = msgs[1:]
        return msgs

    msgs = list(messages)
    # A cheap first cut by characters (tokens average ~4 characters; 8 per token leaves a margin).
    chars = 8 * max_tokens
    while len(msgs) > 1 and sum(len(m["content"]) for m in msgs[1:]) > chars:
        msgs = drop_oldest(msgs)
    if len(msgs) == 1 and len(msgs[0]["content"]) > chars:
        msgs[0] = {**msgs[0], "content": msgs[0]["content"][-chars:]}
    ids = render_prompt(tok, msgs)
    while len(ids) > max_tokens and len(msgs) > 1:
        msgs = drop_oldest(msgs)
        ids = render_prompt(tok, msgs)
    if len(ids) > max_tokens:
        content_ids = tok(msgs[-1]["content"], add_special_tokens=False, verbose=False)["input_ids"]
        keep = max(1, len(content_ids) - (len(ids) - max_tokens))
        msgs[-1] = {**msgs[-1], "content": tok.decode(content_ids[-keep:])}
        ids = render_prompt(tok, msgs)
    return tuple(msgs), ids


def regenerate(target: str, out: str, prompts, temperatures: list[tuple[float, float]], batch: int,
               max_new_tokens: int, device: str, dtype: str = "float32", max_prompt_tokens: int = 256,
               seed: int = 0) -> int:
    """One pass over `prompts` per (temperature, top_p); returns the number of chats written."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=DTYPES[dtype]).to(device).eval()
    eos = model.generation_config.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
    fitted = [fit_prompt(tok, p.messages, max_prompt_tokens) for p in prompts]
    # Similar lengths in one batch waste less on left padding. (Re-encoding the cut text can
    # differ by a token at the cut: the ids are bounded again.)
    encoded = sorted(((p.id, msgs, ids[-max_prompt_tokens:]) for p, (msgs, ids) in zip(prompts, fitted)),
                     key=lambda item: len(item[2]))
    torch.manual_seed(seed)
    written = 0
    with open(out, "w") as f:
        for temp, top_p in temperatures:
            for i in range(0, len(encoded), batch):
                chunk = encoded[i:i + batch]
                width = max(len(ids) for _, _, ids in chunk)
                input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for _, _, ids in chunk], device=device)
                mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, _, ids in chunk], device=device)
                with torch.no_grad():
                    gen = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                         do_sample=temp > 0, temperature=temp if temp > 0 else None, top_k=0,
                                         top_p=top_p, eos_token_id=eos, pad_token_id=pad)
                for (pid, msgs, _), row in zip(chunk, gen[:, width:].tolist()):
                    reply = tok.decode(row, skip_special_tokens=True).strip()
                    if reply:
                        f.write(json.dumps({"id": f"{pid}:{sample_tag(temp, top_p)}", "messages": list(msgs) +
                                            [{"role": "assistant", "content": reply}]}) + "\n")
                        written += 1
                f.flush()   # whole lines only, should the process be stopped
                print(f"regenerate: {sample_tag(temp, top_p)} {i + len(chunk)}/{len(encoded)} prompts", flush=True)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default="sharegpt", help="sharegpt | sharegpt:FILE | jsonl:FILE (chats)")
    ap.add_argument("--prompts", default="first", help="first (first user turn) | all (every user turn)")
    ap.add_argument("--num", type=int, default=None, help="at most this many prompts (before sharding)")
    ap.add_argument("--shard", default="0/1", help="K/N: this process takes prompts K, K+N, K+2N, …")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--temperatures", default="0,1",
                    help="one pass over the prompts per item T or T:TOP_P, e.g. 0,0.6:0.95,1")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", help="float32 | bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        k, n = parse_shard(args.shard)
        if args.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {sorted(DTYPES)}, got {args.dtype!r}")
        temps = parse_temperatures(args.temperatures)
        for name in ("num", "batch", "max_new_tokens", "max_prompt_tokens"):
            value = getattr(args, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
        prompts = training_prompts(args.data, args.prompts, args.num)[k::n]
        written = regenerate(args.target, args.out, prompts, temps, args.batch, args.max_new_tokens,
                             args.device, args.dtype, args.max_prompt_tokens, args.seed + k)
    except ValueError as e:
        ap.exit(2, f"regenerate: error: {e}\n")
    print(f"regenerate: wrote {written} chats to {Path(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
