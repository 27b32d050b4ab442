"""`bench offline --compare-static`: static speculation configurations vs the adaptive policy.

Every configuration is its own engine on the same target: plain decoding, the method at each
static width (`--static-widths`: DFlash/n-gram chains of that block size, DDTree trees of that
budget + 1), and the method at its full width under `spec_policy="adaptive"`. At each
concurrency c the same max(num_prompts, waves × c) prompts (waves 2 by default) run with at most c requests in flight (a request is added as
one finishes: continuous batching, like a server under c clients). The configurations of one
concurrency run back to back, `repeats` rounds in rotated order, and a cell's tok/s is the median
of its rounds, so a shared CPU's bursts of load spread over all of them.

The report: tok/s per (configuration, concurrency), and per concurrency adaptive ÷ best
static and adaptive ÷ plain (the issue's targets: ≥ 0.95 and ≥ 1.0), plus the adaptive
engine's configuration mix. `plot_compare` draws tok/s against concurrency.
"""

from __future__ import annotations

import time
from pathlib import Path

from blockspec.bench import format_table


def static_configurations(spec: str, full_width: int, widths: list[int] | None) -> dict[str, dict]:
    """name → EngineConfig overrides of each static configuration (plain included)."""
    from blockspec.engine.spec_policy import candidate_widths, config_name
    widths = widths or [w for w in candidate_widths(full_width) if w > 1]
    if any(not 2 <= w <= full_width for w in widths):
        raise ValueError(f"static widths must be between 2 and the method's width {full_width}, got {widths}")
    trees = spec == "ddtree"
    out = {"plain": {"spec": "none"}}
    for w in sorted(set(widths)):
        size = {"budget": w - 1} if trees else {"block_size": w}
        out[f"static-{config_name(w, trees)}"] = {**size, "spec_policy": "static"}
    return out


def build_llm(config, top: int, overrides: dict):
    """One configuration's LLM: `overrides` from `static_configurations` (or spec_policy
    "adaptive" alone), at most `top` requests in flight. The flags' own spec_policy and
    max_running_requests are replaced by the comparison's."""
    from dataclasses import replace
    options = {k: v for k, v in config.engine_options.items() if k not in ("spec_policy", "max_running_requests")}
    sizes = {k: overrides[k] for k in ("block_size", "budget") if k in overrides}
    base = replace(config, engine_options=options, **sizes)
    if overrides.get("spec") == "none":
        return base.plain_llm(max_running_requests=top)
    return base.spec_llm(max_running_requests=top, spec_policy=overrides["spec_policy"])


def run_concurrency(llm, prompts: list[list[int]], params: list, concurrency: int) -> dict:
    """All prompts through `llm`'s engine with at most `concurrency` in flight: tok/s and the
    speculation counters of the finished requests."""
    from blockspec.bench.compile_watch import CompileWatch
    engine = llm.engine
    pending = list(range(len(prompts)))[::-1]
    live, tokens, metrics, step_seconds = set(), 0, [], []
    start = time.perf_counter()
    with CompileWatch() as watch:
        while pending or live:
            while pending and len(live) < concurrency:
                i = pending.pop()
                rid = f"cmp-{concurrency}-{i}-{time.monotonic_ns()}"
                engine.add_request(rid, prompts[i], params[i])
                live.add(rid)
            began = time.perf_counter()
            outputs = engine.step()
            step_seconds.append(time.perf_counter() - began)
            for out in outputs:
                tokens += len(out.new_token_ids)
                if out.finished:
                    live.discard(out.request_id)
                    metrics.append(out.metrics)
    seconds = time.perf_counter() - start
    from blockspec.engine.outputs import SpecMetrics
    total = SpecMetrics()
    for m in metrics:
        total.merge(m)
    return {"concurrency": concurrency, "seconds": seconds, "output_tokens": tokens,
            "tok_s": tokens / seconds if seconds > 0 else 0.0, "accept_length": total.accept_length,
            "verify_steps": total.verify_steps, "configurations": dict(total.configurations),
            # What a round's tok/s may hide: Triton compiles inside it, and its slowest steps
            # beside the median one (a stall of a few steps outweighs any configuration).
            **watch.summary(), "engine_steps": len(step_seconds),
            "median_step_ms": round(sorted(step_seconds)[len(step_seconds) // 2] * 1e3, 3) if step_seconds else 0.0,
            "slowest_steps_ms": [round(t * 1e3, 2) for t in sorted(step_seconds)[-3:][::-1]]}


def summarise(records: list[dict]) -> list[dict]:
    """Per concurrency: the best static configuration, adaptive ÷ best static, adaptive ÷ plain."""
    out = []
    for c in sorted({r["concurrency"] for r in records}):
        cell = {r["configuration"]: r for r in records if r["concurrency"] == c}
        statics = {k: v["tok_s"] for k, v in cell.items() if k != "adaptive"}
        best = max(statics, key=statics.get)
        adaptive = cell["adaptive"]["tok_s"] if "adaptive" in cell else None
        out.append({"concurrency": c, "best_static": best, "best_static_tok_s": statics[best],
                    "adaptive_tok_s": adaptive,
                    "adaptive_vs_best_static": adaptive / statics[best] if adaptive and statics[best] else None,
                    "adaptive_vs_plain": adaptive / statics["plain"] if adaptive and statics.get("plain") else None})
    return out


def median_record(runs: list[dict]) -> dict:
    """One cell from its rounds: the round of median tok/s, with every round's tok/s."""
    ordered = sorted(runs, key=lambda r: r["tok_s"])
    return {**ordered[(len(ordered) - 1) // 2], "tok_s_rounds": [r["tok_s"] for r in runs],
            "compiles_rounds": [r.get("triton_compiles", 0) for r in runs]}


def run_compare(config, concurrencies: list[int], static_widths: list[int] | None, warm_up,
                repeats: int = 1, waves: int = 2, on_progress=None, warmup_rounds: int = 0) -> dict:
    """Every configuration at every concurrency. `config`: the OfflineBenchConfig (its first
    dataset and temperature); `warm_up(llm, ids)` runs one short request; `on_progress(doc)`,
    when given, gets the document of the concurrencies done so far after each one (a run cut
    short keeps them). `warmup_rounds`: untimed rounds of every configuration before a
    concurrency's timed ones (on the H100 the first round paid the Triton compiles of new prefill
    shapes: plain at c = 1 made 848–1,059 tok/s in it against 1,830–2,492 after, and with two
    rounds the median is that round for whichever engine ran first)."""
    from blockspec.bench.datasets import load_dataset
    from blockspec.bench.offline import _params, prompt_token_ids
    if not concurrencies or any(c < 1 for c in concurrencies):
        raise ValueError(f"concurrencies must be positive, got {concurrencies}")
    if repeats < 1:
        raise ValueError(f"repeats must be positive, got {repeats}")
    if waves < 1:
        raise ValueError(f"waves must be positive, got {waves}")
    if warmup_rounds < 0:
        raise ValueError(f"warmup_rounds must be non-negative, got {warmup_rounds}")
    top = max(concurrencies)
    adaptive = build_llm(config, top, {"spec_policy": "adaptive"})
    engine = adaptive.engine
    llms = {name: build_llm(config, top, over)
            for name, over in static_configurations(config.spec, engine.spec_step.full_width, static_widths).items()}
    llms["adaptive"] = adaptive
    n = max(config.num_prompts, waves * top)
    prompts = load_dataset(config.datasets[0], n, config.seed, random_input_len=config.random_input_len,
                           random_output_len=config.random_output_len)
    limit = max(1, engine.max_model_len - max((config.max_tokens or p.output_len or 128) for p in prompts)
                - engine.lookahead)
    ids = [prompt_token_ids(p, adaptive.tokenizer, limit) for p in prompts]
    params = _params(config, prompts, config.temperatures[0], 0)
    for llm in llms.values():
        warm_up(llm, ids[0])
    records = []
    names = list(llms)
    for i, c in enumerate(concurrencies):
        k = max(config.num_prompts, waves * c)
        rounds: dict[str, list] = {name: [] for name in names}
        for _ in range(warmup_rounds):
            for name in names:
                run_concurrency(llms[name], ids[:k], params[:k], c)
        for r in range(repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                rounds[name].append(run_concurrency(llms[name], ids[:k], params[:k], c))
        records += [{"configuration": name, **median_record(rounds[name])} for name in names]
        done = concurrencies[:i + 1]
        doc = {**config.spec_fields(), "dataset": config.datasets[0], "temperature": config.temperatures[0],
               "num_prompts": {c: max(config.num_prompts, waves * c) for c in done}, "concurrencies": done,
               "repeats": repeats, "warmup_rounds": warmup_rounds, "records": records, "summary": summarise(records),
               "policy_host_seconds": engine.policy.host_seconds, "cost_tables": cost_tables(engine.policy),
               "cost_samples": cost_samples(engine.policy),
               # The GPU time of each captured step alone (startup replays; none on a CPU): what
               # the timed costs above hold beyond it is host work, overlap and noise.
               "cost_priors_ms": {f"{b}/{w}/{v}": round(t * 1e3, 4) for (b, w, v), t in sorted(engine.policy.cost.priors.items())}}
        if on_progress is not None:
            on_progress(doc)
    return doc


def cost_tables(policy) -> dict:
    """The adaptive policy's measured step cost per batch bucket it ran: width → ms (None:
    not timed), to set beside the static configurations' tok/s."""
    return {str(b): {str(w): None if t is None else round(t * 1e3, 4) for w, t in policy.cost.table(b).items()}
            for b in policy.cost.buckets if any(t is not None for t in policy.cost.table(b).values())}


def cost_samples(policy) -> dict:
    """The timings behind `cost_tables` (ms, oldest first, at most the model's window a key): a
    width whose estimate stands apart from its neighbours' shows here whether one pair of
    samples or all of them put it there."""
    out: dict[str, dict[str, list]] = {}
    for (bucket, width), samples in sorted(policy.cost.samples().items()):
        out.setdefault(str(bucket), {})[str(width)] = [round(t * 1e3, 4) for t in samples]
    return out


def plot_compare(doc: dict, path: Path) -> None:
    """tok/s against concurrency (log2 axis), one line per configuration, adaptive in bold."""
    from blockspec.bench.plots import plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = list(dict.fromkeys(r["configuration"] for r in doc["records"]))
    for name in names:
        rs = sorted((r for r in doc["records"] if r["configuration"] == name), key=lambda r: r["concurrency"])
        ax.plot([r["concurrency"] for r in rs], [r["tok_s"] for r in rs], marker="o", label=name,
                linewidth=2.5 if name == "adaptive" else 1.0, linestyle="-" if name in ("adaptive", "plain") else "--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(doc["concurrencies"], labels=[str(c) for c in doc["concurrencies"]])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tok/s")
    ax.set_title(f"static vs adaptive speculation ({doc['spec']}, T={doc['temperature']:g})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def compiled_cells(doc: dict) -> list[str]:
    """'configuration @ c: n compiles (s)' for each timed cell whose chosen round compiled Triton
    kernels: its tok/s paid for them."""
    return [f"{r['configuration']} @ {r['concurrency']}: {r['triton_compiles']} compiles ({r['compile_seconds']} s)"
            for r in doc["records"] if r.get("triton_compiles")]


def format_compare(doc: dict) -> str:
    rows = [[s["concurrency"], s["best_static"], s["best_static_tok_s"], s["adaptive_tok_s"],
             s["adaptive_vs_best_static"], s["adaptive_vs_plain"],
             " ".join(f"{k} {v}" for k, v in sorted(next(r for r in doc["records"] if r["configuration"] == "adaptive"
                                                          and r["concurrency"] == s["concurrency"])
                                                     ["configurations"].items()))]
            for s in doc["summary"]]
    return format_table(["conc", "best static", "best tok/s", "adaptive tok/s", "÷ best", "÷ plain",
                         "adaptive mix (request steps)"], rows)
