"""Tensor parallelism on a multi-GPU machine (issue 18). Not yet run: multi-GPU kinds were not lent.

  python bench/tp_gpu.py equal  --model DIR [--sizes 2 4 8]   greedy bf16 outputs at TP=N equal TP=1's
  python bench/tp_gpu.py decode --model DIR [--sizes 1 2 4]   decode-step time per TP size (batch 1, 8)

`decode` times `Engine.step` on plain greedy decoding (CUDA graphs off: TP refuses them) over a
random-weight checkpoint of the Qwen3-8B shape (`--write-qwen3-8b DIR` writes one with
transformers). `blockspec bench step --shape qwen3-8b` has no --tp yet, so this is the TP figure;
the issue's targets: TP 2 ≤ 0.6 × TP 1, TP 4 ≤ 0.35 ×. Results go to bench/results/tp_gpu_*.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from blockspec.llm import LLM
from blockspec.sampling import SamplingParams

PROMPTS = [[(17 * i + 3 * j) % 5000 + 10 for j in range(64)] for i in range(8)]


def equal(model: str, sizes: list[int]) -> dict:
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    with LLM(model=model, dtype="bfloat16", device="cuda", cuda_graph=False) as ref:
        want = [o.token_ids for o in ref.generate(PROMPTS, greedy)]
    out = {}
    for n in sizes:
        with LLM(model=model, dtype="bfloat16", device="cuda", cuda_graph=False, tensor_parallel_size=n) as llm:
            got = [o.token_ids for o in llm.generate(PROMPTS, greedy)]
        same = sum(a == b for a, b in zip(got, want))
        out[f"tp{n}"] = {"identical_rows": same, "rows": len(want)}
        print(f"TP={n}: {same}/{len(want)} greedy rows identical to TP=1")
    return out


def decode(model: str, sizes: list[int]) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    out = {}
    for n in sizes:
        with LLM(model=model, dtype="bfloat16", device="cuda", cuda_graph=False, tensor_parallel_size=n) as llm:
            for batch in (1, 8):
                llm.generate(PROMPTS[:batch], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
                engine = llm.engine
                for i, p in enumerate(PROMPTS[:batch]):
                    engine.add_request(f"d{n}-{batch}-{i}", p, params)
                engine.step()                       # the prefill
                times = []
                while engine.has_unfinished_requests():
                    t = time.perf_counter()
                    engine.step()
                    times.append(time.perf_counter() - t)
                times.sort()
                out[f"tp{n}_bs{batch}_ms"] = 1000 * times[len(times) // 2]
                print(f"TP={n} batch {batch}: decode step {out[f'tp{n}_bs{batch}_ms']:.2f} ms (median)")
    for batch in (1, 8):
        base = out.get(f"tp1_bs{batch}_ms")
        for n in sizes:
            if base and n > 1:
                out[f"tp{n}_bs{batch}_ratio"] = out[f"tp{n}_bs{batch}_ms"] / base
    return out


def write_qwen3_8b(out: str) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=4096,
                      tie_word_embeddings=False, torch_dtype="bfloat16")
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    from tokenizers import Tokenizer, models  # a placeholder tokenizer: decode ids only
    Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")).save(str(Path(out) / "tokenizer.json"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["equal", "decode", "write-qwen3-8b"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--sizes", type=int, nargs="+")
    args = ap.parse_args()
    if args.what == "write-qwen3-8b":
        write_qwen3_8b(args.model)
        return
    sizes = args.sizes or ([2, 4, 8] if args.what == "equal" else [1, 2, 4])
    result = (equal if args.what == "equal" else decode)(args.model, sizes)
    Path("bench/results").mkdir(parents=True, exist_ok=True)
    Path(f"bench/results/tp_gpu_{args.what}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
