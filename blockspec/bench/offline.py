"""`blockspec bench offline`: speculative vs plain decoding on the same prompts, in one process.

Both engines are built once and run the same prompts with the same seeds; tokens/s of each
gives the speedup. With `batch_size` 1 every prompt is its own `generate` call (latency); larger
values batch prompts into one call. Accept length and per-position acceptance follow
docs/metrics.md: committed tokens per verify step (bonus included), and the share of verify
steps whose draft position k was accepted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from blockspec.bench import SpecEngineArgs, format_table
from blockspec.bench.datasets import BenchPrompt, load_dataset

DEFAULT_MAX_TOKENS = 128


@dataclass
class OfflineBenchConfig(SpecEngineArgs):
    datasets: list[str] = field(default_factory=lambda: ["random"])
    num_prompts: int = 8
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    batch_size: int = 1
    max_tokens: int | None = None  # None: a prompt's own output length, else DEFAULT_MAX_TOKENS
    seed: int = 0
    request_seeds: bool = True    # request i carries seed + i (reproducible sampled runs)
    ignore_eos: bool = False
    random_input_len: int = 128
    random_output_len: int = 128
    progress: bool = True

    def validate(self) -> None:
        if self.spec == "none":
            raise ValueError("bench offline compares a speculative method with plain decoding: --spec must not be none")
        if self.batch_size < 1 or self.num_prompts < 1:
            raise ValueError("--batch-size and --num-prompts must be positive")


@dataclass
class _Run:
    """Totals of one engine over one (dataset, temperature) cell."""

    seconds: float = 0.0
    output_tokens: int = 0
    outputs: list = field(default_factory=list)

    def summary(self) -> dict:
        return {"seconds": self.seconds, "output_tokens": self.output_tokens,
                "tok_s": self.output_tokens / self.seconds if self.seconds > 0 else 0.0}


def build_engines(config: OfflineBenchConfig):
    """(speculative LLM, plain LLM) on the same target."""
    return config.spec_llm(), config.plain_llm()


def prompt_token_ids(prompt: BenchPrompt, tokenizer, limit: int) -> list[int]:
    """Token ids of a benchmark prompt: chat template for chat prompts when the model has one,
    random prompts cut to their token length, and at most `limit` tokens (the end kept, so a
    chat prompt keeps its generation prompt)."""
    if prompt.chat and tokenizer.has_chat_template:
        ids = list(tokenizer.apply_chat_template(prompt.messages(), add_generation_prompt=True))
    else:
        ids = list(tokenizer.encode(prompt.text))
    if prompt.input_len is not None:
        ids = ids[: prompt.input_len]
    return ids[-limit:]


def _params(config: OfflineBenchConfig, prompts: list[BenchPrompt], temperature: float, first: int):
    from blockspec.sampling import SamplingParams
    return [SamplingParams(temperature=temperature, max_tokens=_max_tokens(config, p),
                           seed=config.seed + first + i if config.request_seeds else None,
                           ignore_eos=config.ignore_eos)
            for i, p in enumerate(prompts)]


def _max_tokens(config: OfflineBenchConfig, prompt: BenchPrompt) -> int:
    if config.max_tokens is not None:
        return config.max_tokens
    return prompt.output_len or DEFAULT_MAX_TOKENS


def _timed_run(llm, ids: list[list[int]], params: list, batch_size: int, bar) -> _Run:
    run = _Run()
    for start in range(0, len(ids), batch_size):
        t0 = time.perf_counter()
        outs = llm.generate(ids[start:start + batch_size], params[start:start + batch_size])
        run.seconds += time.perf_counter() - t0
        run.output_tokens += sum(len(o.token_ids) for o in outs)
        run.outputs.extend(outs)
        bar.update(len(outs))
    return run


def cell_record(dataset: str, temperature: float, config: OfflineBenchConfig, spec_run: _Run, plain_run: _Run) -> dict:
    from blockspec.llm import LLM
    metrics = LLM.aggregate_metrics(spec_run.outputs)
    steps = metrics.verify_steps
    spec_summary, plain_summary = spec_run.summary(), plain_run.summary()
    greedy_match = None
    if temperature == 0:  # greedy: speculation must not change the output
        same = sum(a.token_ids == b.token_ids for a, b in zip(spec_run.outputs, plain_run.outputs))
        greedy_match = same / len(spec_run.outputs)
    return {
        "dataset": dataset,
        "temperature": temperature,
        "num_prompts": len(spec_run.outputs),
        "batch_size": config.batch_size,
        "spec": spec_summary,
        "plain": plain_summary,
        "speedup": spec_summary["tok_s"] / plain_summary["tok_s"] if plain_summary["tok_s"] > 0 else None,
        "algorithm": metrics.algorithm,
        "accept_length": metrics.accept_length,
        "verify_steps": steps,
        "drafted_tokens": metrics.drafted_tokens,
        "accepted_tokens": metrics.accepted_tokens,
        "acceptance_per_position": [c / steps for c in metrics.accepted_per_position] if steps else [],
        "greedy_match": greedy_match,
    }


def _warm_up(llm, ids: list[int]) -> None:
    """One short request, so that neither engine's first-call costs land in a timing."""
    from blockspec.sampling import SamplingParams
    llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=2))


def run_offline_bench(config: OfflineBenchConfig, engines=None) -> dict:
    """Every (dataset, temperature) cell; `engines` = (spec LLM, plain LLM) to reuse."""
    from tqdm import tqdm
    config.validate()
    spec_llm, plain_llm = engines or build_engines(config)
    engine = spec_llm.engine
    records = []
    for dataset in config.datasets:
        prompts = load_dataset(dataset, config.num_prompts, config.seed, random_input_len=config.random_input_len,
                               random_output_len=config.random_output_len)
        limit = max(1, engine.max_model_len - max(_max_tokens(config, p) for p in prompts) - engine.lookahead)
        ids = [prompt_token_ids(p, spec_llm.tokenizer, limit) for p in prompts]
        _warm_up(spec_llm, ids[0])
        _warm_up(plain_llm, ids[0])
        for temperature in config.temperatures:
            params = _params(config, prompts, temperature, 0)
            with tqdm(total=2 * len(ids), desc=f"{dataset} T={temperature:g}", disable=not config.progress,
                      leave=False) as bar:
                spec_run = _timed_run(spec_llm, ids, params, config.batch_size, bar)
                plain_run = _timed_run(plain_llm, ids, params, config.batch_size, bar)
            records.append(cell_record(dataset, temperature, config, spec_run, plain_run))
    return {**config.spec_fields(), "batch_size": config.batch_size, "records": records}


def format_records(records: list[dict]) -> str:
    headers = ["dataset", "temp", "prompts", "spec tok/s", "plain tok/s", "speedup", "accept", "per-position acceptance",
               "greedy match"]
    rows = [[r["dataset"], f'{r["temperature"]:g}', r["num_prompts"], r["spec"]["tok_s"], r["plain"]["tok_s"], r["speedup"],
             r["accept_length"], " ".join(f"{a:.2f}" for a in r["acceptance_per_position"][:8]), r["greedy_match"]]
            for r in records]
    return format_table(headers, rows) + "\n(accept = committed tokens per verify step, bonus included)"
