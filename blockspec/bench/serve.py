"""`blockspec bench serve`: load test of any OpenAI-compatible server (blockspec, vLLM, SGLang).

Every request streams (`stream_options.include_usage`), so time to first token and the gaps
between chunks are measured on the client, as SGLang's bench_serving and vLLM's bench serve do
(docs/metrics.md): TTFT, TPOT = (latency − TTFT)/(output tokens − 1), ITL = time between content
chunks (a speculative server may put several tokens in one chunk). One cell of the sweep is one
(concurrency, temperature) pair; its requests arrive as a Poisson process of rate
`request_rate` (all at once when infinite) and at most `concurrency` are in flight.

Accept length (committed tokens per verify step, bonus included) comes from two places when
the server has them: the `spec_decoding` object of each response (summed committed tokens /
summed verify steps), and the deltas of the server's Prometheus counters over the cell.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import httpx

from blockspec.bench import format_table, summarize
from blockspec.bench.datasets import BenchPrompt

DEFAULT_MAX_TOKENS = 128
# (verify-step counter, accepted-draft-token counter) of servers that export them.
SPEC_COUNTERS = (
    ("blockspec:spec_verify_steps_total", "blockspec:spec_accepted_tokens_total"),
    ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total"),
)
GENERATION_COUNTERS = ("blockspec:generation_tokens_total", "vllm:generation_tokens_total")
METRICS_SETTLE_S = 2.0


class ServerUnreachable(ConnectionError):
    """The server did not answer /v1/models."""


@dataclass
class ServeBenchConfig:
    url: str
    prompts: list[BenchPrompt]
    concurrencies: list[int]
    temperatures: list[float]
    max_tokens: int | None = None  # None: a prompt's own output length, else DEFAULT_MAX_TOKENS
    model: str | None = None       # None: the first model of /v1/models
    api_key: str | None = None
    request_rate: float = math.inf
    seed: int = 0
    ignore_eos: bool = False
    timeout_s: float = 600.0
    progress: bool = True
    warmup: bool = True


@dataclass
class RequestResult:
    ok: bool
    error: str | None = None
    ttft: float | None = None
    latency: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    spec: dict | None = None  # the response's spec_decoding object, if any

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.latency is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


# ---- talking to the server -------------------------------------------------------------------

def normalize_base_url(url: str) -> str:
    """`http://host:port` from a URL given with or without a trailing /v1."""
    base = url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def first_model(client: httpx.AsyncClient, base: str, api_key: str | None) -> str:
    try:
        response = await client.get(f"{base}/v1/models", headers=auth_headers(api_key))
    except httpx.HTTPError as e:
        raise ServerUnreachable(f"cannot reach {base}/v1/models: {e!r}") from e
    if response.status_code != 200:
        raise ServerUnreachable(f"{base}/v1/models answered {response.status_code}: {response.text[:200]}")
    models = response.json().get("data") or []
    if not models:
        raise ServerUnreachable(f"{base}/v1/models lists no model")
    return models[0]["id"]


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample values by metric name, summed over label sets."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if "{" in line:  # name{labels} value [timestamp]; label values may hold spaces
            name, _, rest = line.partition("{")
            rest = rest.rpartition("}")[2]
        else:
            name, _, rest = line.partition(" ")
        fields = rest.split()
        try:
            values[name.strip()] = values.get(name.strip(), 0.0) + float(fields[0])
        except (ValueError, IndexError):
            continue
    return values


async def scrape_metrics(client: httpx.AsyncClient, base: str) -> dict[str, float] | None:
    """The server's /metrics, or None when it has none."""
    try:
        response = await client.get(f"{base}/metrics")
    except httpx.HTTPError:
        return None
    return parse_prometheus(response.text) if response.status_code == 200 else None


async def settled_metrics(client: httpx.AsyncClient, base: str, before: dict[str, float] | None,
                          generated: int) -> dict[str, float] | None:
    """/metrics once the server has counted the cell's `generated` tokens.

    A server may stream a request's last chunk before its metrics see that step, so a scrape
    right after the cell can miss it; the generation-token counter tells when it has caught up.
    """
    deadline = time.monotonic() + METRICS_SETTLE_S
    while True:
        after = await scrape_metrics(client, base)
        name = next((n for n in GENERATION_COUNTERS if after and n in after), None)
        if before is None or name is None or after[name] - before.get(name, 0.0) >= generated \
                or time.monotonic() > deadline:
            return after
        await asyncio.sleep(0.02)


def accept_length_from_counters(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Δcommitted / Δverify_steps where the server counts committed tokens (blockspec), else
    1 + Δaccepted / Δverify_steps (vLLM's convention, which also counts tokens cut by stops)."""
    if before is None or after is None:
        return None
    steps_name, committed_name = "blockspec:spec_verify_steps_total", "blockspec:spec_committed_tokens_total"
    if steps_name in after and committed_name in after:
        steps = after[steps_name] - before.get(steps_name, 0.0)
        committed = after[committed_name] - before.get(committed_name, 0.0)
        return committed / steps if steps > 0 else None
    for steps_name, accepted_name in SPEC_COUNTERS:
        if steps_name in after and accepted_name in after:
            steps = after[steps_name] - before.get(steps_name, 0.0)
            accepted = after[accepted_name] - before.get(accepted_name, 0.0)
            return 1 + accepted / steps if steps > 0 else None
    return None


def build_request(prompt: BenchPrompt, model: str, temperature: float, max_tokens: int, seed: int,
                  ignore_eos: bool) -> tuple[str, dict]:
    """(path, JSON body) of one streaming request."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
            "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True  # not OpenAI: only sent when asked for
    if prompt.chat:
        return "/v1/chat/completions", {**body, "messages": prompt.messages()}
    return "/v1/completions", {**body, "prompt": prompt.text}


def _chunk_text(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return (choice["delta"] or {}).get("content") or ""
    return choice.get("text") or ""


async def stream_request(client: httpx.AsyncClient, url: str, body: dict, headers: dict) -> RequestResult:
    """Send one streaming request and time its chunks."""
    start = time.perf_counter()
    result = RequestResult(ok=False)
    content_chunks = 0
    last = start
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return RequestResult(ok=False, error=f"HTTP {response.status_code}: {text[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return RequestResult(ok=False, error=f"stream error: {json.dumps(chunk['error'])[:200]}")
                now = time.perf_counter()
                if _chunk_text(chunk):
                    content_chunks += 1
                    if result.ttft is None:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"].get("completion_tokens") or 0
                    result.prompt_tokens = chunk["usage"].get("prompt_tokens") or 0
                if chunk.get("spec_decoding"):
                    result.spec = chunk["spec_decoding"]
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        return RequestResult(ok=False, error=repr(e))
    result.latency = time.perf_counter() - start
    result.output_tokens = result.output_tokens or content_chunks  # servers without usage
    result.ok = True
    return result


# ---- one cell of the sweep -------------------------------------------------------------------

def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, dynamic_ncols=True)


async def run_cell(client: httpx.AsyncClient, config: ServeBenchConfig, base: str, model: str,
                   concurrency: int, temperature: float) -> tuple[list[RequestResult], float]:
    """All prompts at one (concurrency, temperature): (results in prompt order, seconds)."""
    gate = asyncio.Semaphore(concurrency)
    arrivals = random.Random(config.seed)
    headers = auth_headers(config.api_key)
    bar = _progress_bar(len(config.prompts), f"concurrency {concurrency} T={temperature:g}", config.progress)

    async def one(index: int, prompt: BenchPrompt) -> RequestResult:
        path, body = build_request(prompt, model, temperature, _max_tokens(config, prompt),
                                   config.seed + index, config.ignore_eos)
        async with gate:
            result = await stream_request(client, base + path, body, headers)
        bar.update(1)
        return result

    start = time.perf_counter()
    tasks = []
    for index, prompt in enumerate(config.prompts):
        tasks.append(asyncio.create_task(one(index, prompt)))
        if math.isfinite(config.request_rate) and index < len(config.prompts) - 1:
            await asyncio.sleep(arrivals.expovariate(config.request_rate))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    bar.close()
    return list(results), duration


def _max_tokens(config: ServeBenchConfig, prompt: BenchPrompt) -> int:
    if config.max_tokens is not None:
        return config.max_tokens
    return prompt.output_len or DEFAULT_MAX_TOKENS


def response_accept_length(results: list[RequestResult]) -> float | None:
    """Summed committed tokens / summed verify steps over the responses' spec_decoding."""
    steps = committed = 0.0
    for r in results:
        if r.spec and r.spec.get("verify_steps"):
            steps += r.spec["verify_steps"]
            committed += r.spec.get("accept_length", 0.0) * r.spec["verify_steps"]
    return committed / steps if steps else None


def cell_record(concurrency: int, temperature: float, results: list[RequestResult], duration: float,
                metrics_accept_length: float | None) -> dict:
    """The JSON record of one cell (times in milliseconds)."""
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    prompt_tokens = sum(r.prompt_tokens for r in done)
    algorithms = {r.spec.get("algorithm") for r in done if r.spec}
    return {
        "concurrency": concurrency,
        "temperature": temperature,
        "num_prompts": len(results),
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / duration if duration > 0 else 0.0,
        "total_tok_s": (output_tokens + prompt_tokens) / duration if duration > 0 else 0.0,
        "requests_s": len(done) / duration if duration > 0 else 0.0,
        "ttft_ms": summarize([r.ttft for r in done if r.ttft is not None], 1e3),
        "tpot_ms": summarize([r.tpot for r in done if r.tpot is not None], 1e3),
        "itl_ms": summarize([gap for r in done for gap in r.itl], 1e3),
        "e2e_latency_ms": summarize([r.latency for r in done], 1e3),
        "spec_algorithm": algorithms.pop() if len(algorithms) == 1 else None,
        "accept_length": response_accept_length(done),
        "accept_length_metrics": metrics_accept_length,
        "request_accept_lengths": [r.spec["accept_length"] for r in done
                                   if r.spec and r.spec.get("verify_steps")],
    }


# ---- the sweep -------------------------------------------------------------------------------

async def run_sweep(config: ServeBenchConfig) -> dict:
    """Every (concurrency, temperature) cell, in order; returns the results document (no files)."""
    base = normalize_base_url(config.url)
    limits = httpx.Limits(max_connections=max(config.concurrencies) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s), limits=limits) as client:
        model = config.model or await first_model(client, base, config.api_key)
        if config.warmup:
            await _warm_up(client, config, base, model)
        records = []
        for temperature in config.temperatures:
            for concurrency in config.concurrencies:
                before = await scrape_metrics(client, base)
                results, duration = await run_cell(client, config, base, model, concurrency, temperature)
                after = await settled_metrics(client, base, before, sum(r.output_tokens for r in results if r.ok))
                records.append(cell_record(concurrency, temperature, results, duration,
                                           accept_length_from_counters(before, after)))
    return {"server_url": base, "model": model, "records": records}


async def _warm_up(client: httpx.AsyncClient, config: ServeBenchConfig, base: str, model: str) -> None:
    """One short request first, so that no cell pays for the server's first-request costs."""
    path, body = build_request(config.prompts[0], model, 0.0, 4, config.seed, config.ignore_eos)
    await stream_request(client, base + path, body, auth_headers(config.api_key))


def run_serve_bench(config: ServeBenchConfig, output_dir: str | Path, command_line: str,
                    settings: dict | None = None) -> dict:
    """Run the sweep, write results.json and the plots into `output_dir`, return the document."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    document = {"command": command_line, "timestamp": started, **asyncio.run(run_sweep(config)),
                "settings": settings or {}}
    from blockspec.bench.plots import write_serve_plots
    document["plots"] = write_serve_plots(document["records"], out)
    (out / "results.json").write_text(json.dumps(document, indent=2))
    return document


def format_records(records: list[dict]) -> str:
    headers = ["conc", "temp", "ok", "fail", "out tok/s", "req/s", "TTFT mean", "TTFT p50", "TTFT p99",
               "TPOT mean", "TPOT p50", "TPOT p99", "ITL p50", "ITL p99", "accept", "accept(/metrics)"]
    rows = [[r["concurrency"], f'{r["temperature"]:g}', r["completed"], r["failed"], r["output_tok_s"], r["requests_s"],
             r["ttft_ms"]["mean"], r["ttft_ms"]["p50"], r["ttft_ms"]["p99"],
             r["tpot_ms"]["mean"], r["tpot_ms"]["p50"], r["tpot_ms"]["p99"],
             r["itl_ms"]["p50"], r["itl_ms"]["p99"], r["accept_length"], r["accept_length_metrics"]]
            for r in records]
    return format_table(headers, rows) + "\n(times in ms; accept = committed tokens per verify step)"
