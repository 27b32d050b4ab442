"""`blockspec check temperature`: does a server really sample at temperature > 0?

A known failure of speculative engines is verification that silently falls back to greedy,
or ignores seeds, on the speculative path (docs/verification.md). From outside the target's
distribution is unknown, so the checks only use what must hold for any model:

- every request succeeds;
- temperature 0 gives the same text on every repeat;
- at each temperature > 0 a seed reproduces its text (once inside a batch of other seeds and
  once alone, so batch composition must not matter), and different seeds do not all give the
  same text;
- at the highest temperature the seeded samples are not all the greedy output: FAIL only when
  every seed's first token is the greedy first token AND every full output is the greedy output
  ("speculation silently greedy"); a peaked first token alone is reported, not failed;
- a speculative server (spec_decoding.algorithm != "none") reports an accept length > 1
  (committed tokens per verify step, summed over all the check's requests).
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field

import httpx

from blockspec.bench import format_table
from blockspec.bench.serve import ServerUnreachable, auth_headers, first_model, normalize_base_url

DEFAULT_PROMPT = "Write a short poem about the ocean."


@dataclass
class TemperatureCheckConfig:
    url: str
    prompt: str = DEFAULT_PROMPT
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.6, 1.0])
    top_p: float = 0.95
    max_tokens: int = 128
    num_seeds: int = 16
    repeats: int = 3
    seed: int = 1234
    model: str | None = None
    api_key: str | None = None
    endpoint: str = "chat"  # or "completions"
    concurrency: int = 8
    timeout_s: float = 300.0

    def validate(self) -> None:
        if 0.0 not in self.temperatures or not any(t > 0 for t in self.temperatures):
            raise ValueError("--temperatures needs 0 and at least one temperature > 0")
        if any(t < 0 for t in self.temperatures):
            raise ValueError("temperatures must be >= 0")
        if not 2 <= self.repeats <= 10:
            raise ValueError(f"--repeats must be between 2 and 10, got {self.repeats}")
        if self.num_seeds < 2:
            raise ValueError(f"--num-seeds must be at least 2, got {self.num_seeds}")
        if self.max_tokens < 1 or self.concurrency < 1:
            raise ValueError("--max-tokens and --concurrency must be positive")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.endpoint not in ("chat", "completions"):
            raise ValueError(f"--endpoint must be chat or completions, got {self.endpoint!r}")


@dataclass
class Completion:
    ok: bool
    text: str = ""
    error: str | None = None
    tokens: int = 0
    seconds: float = 0.0
    spec: dict | None = None


@dataclass
class TemperatureSamples:
    """Everything the checks look at, per temperature."""

    greedy: list[Completion]                 # T=0 repeats, no seed
    greedy_first: Completion                 # T=0, one token
    seeded: dict[float, list[Completion]]    # T>0, seeds seed … seed+N−1, sent together
    alone: dict[float, Completion]           # T>0, the first seed again, alone
    first: dict[float, list[Completion]]     # T>0, one token per seed

    def all(self) -> list[Completion]:
        out = [*self.greedy, self.greedy_first, *self.alone.values()]
        for group in (*self.seeded.values(), *self.first.values()):
            out.extend(group)
        return out


@dataclass
class CheckRow:
    name: str
    passed: bool
    detail: str


# ---- requests --------------------------------------------------------------------------------

class _Client:
    def __init__(self, http: httpx.AsyncClient, base: str, model: str, config: TemperatureCheckConfig):
        self.http, self.base, self.model, self.config = http, base, model, config
        self.gate = asyncio.Semaphore(config.concurrency)

    async def complete(self, temperature: float, max_tokens: int, seed: int | None) -> Completion:
        c = self.config
        body = {"model": self.model, "temperature": temperature, "top_p": c.top_p, "max_tokens": max_tokens}
        if seed is not None:
            body["seed"] = seed
        if c.endpoint == "chat":
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": c.prompt}]
        else:
            path, body["prompt"] = "/v1/completions", c.prompt
        async with self.gate:
            start = time.perf_counter()
            try:
                response = await self.http.post(self.base + path, json=body, headers=auth_headers(c.api_key))
            except httpx.HTTPError as e:
                return Completion(ok=False, error=repr(e))
            seconds = time.perf_counter() - start
        return _parse_completion(response, seconds, c.endpoint)

    async def many(self, temperature: float, max_tokens: int, seeds: list[int | None]) -> list[Completion]:
        return list(await asyncio.gather(*(self.complete(temperature, max_tokens, s) for s in seeds)))


def _parse_completion(response: httpx.Response, seconds: float, endpoint: str) -> Completion:
    if response.status_code != 200:
        return Completion(ok=False, error=f"HTTP {response.status_code}: {response.text[:200]}")
    try:
        data = response.json()
        choice = data["choices"][0]
        text = choice["message"]["content"] if endpoint == "chat" else choice["text"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return Completion(ok=False, error=f"malformed response: {e!r}")
    tokens = (data.get("usage") or {}).get("completion_tokens") or 0
    return Completion(ok=True, text=text or "", tokens=tokens, seconds=seconds, spec=data.get("spec_decoding"))


async def collect_samples(config: TemperatureCheckConfig) -> TemperatureSamples:
    """Send every request the checks need (raises ServerUnreachable when /v1/models fails)."""
    base = normalize_base_url(config.url)
    limits = httpx.Limits(max_connections=config.concurrency + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s), limits=limits) as http:
        model = config.model or await first_model(http, base, config.api_key)
        client = _Client(http, base, model, config)
        seeds = [config.seed + i for i in range(config.num_seeds)]
        greedy = await client.many(0.0, config.max_tokens, [None] * config.repeats)
        greedy_first = await client.complete(0.0, 1, None)
        seeded, alone, first = {}, {}, {}
        for t in (t for t in config.temperatures if t > 0):
            seeded[t] = await client.many(t, config.max_tokens, seeds)
            alone[t] = await client.complete(t, config.max_tokens, seeds[0])
            first[t] = await client.many(t, 1, seeds)
    return TemperatureSamples(greedy, greedy_first, seeded, alone, first)


# ---- checks ----------------------------------------------------------------------------------

def check_no_errors(samples: TemperatureSamples) -> CheckRow:
    failed = [c for c in samples.all() if not c.ok]
    total = len(samples.all())
    detail = f"{total - len(failed)}/{total} requests succeeded"
    return CheckRow("no errors", not failed, detail + (f"; first error: {failed[0].error}" if failed else ""))


def check_greedy_repeats(samples: TemperatureSamples) -> CheckRow:
    texts = [c.text for c in samples.greedy if c.ok]
    ok = len(texts) == len(samples.greedy) and len(set(texts)) == 1
    detail = f"{len(set(texts))} distinct of {len(texts)} repeats"
    if not ok:
        detail += "; a GPU server holds this only with --batch-invariant"
    return CheckRow("T=0 identical across repeats", ok, detail)


def check_seed_reproducible(t: float, samples: TemperatureSamples) -> CheckRow:
    batched, alone = samples.seeded[t][0], samples.alone[t]
    ok = batched.ok and alone.ok and batched.text == alone.text
    # In bf16 a token's logits differ in their last bits with the batch around it (GEMM tilings),
    # so a near-tie can flip a seeded token, or a greedy one; only `--batch-invariant` servers
    # promise the same text batched and alone (seen on an H100: bench/results/gpu_session_l/).
    detail = "same text in a batch and alone" if ok else (
        "the same seed gave different texts (or failed); a GPU server holds this only with --batch-invariant")
    return CheckRow(f"T={t:g} reproducible under a fixed seed", ok, detail)


def check_seeds_differ(t: float, samples: TemperatureSamples) -> CheckRow:
    texts = [c.text for c in samples.seeded[t] if c.ok]
    distinct = len(set(texts))
    return CheckRow(f"T={t:g} different across seeds", distinct > 1, f"{distinct} distinct texts over {len(texts)} seeds")


def check_not_silently_greedy(samples: TemperatureSamples) -> CheckRow:
    """FAIL only when every seeded sample at the highest temperature is the greedy output,
    first token and full text alike."""
    t = max(samples.seeded)
    greedy_text = next((c.text for c in samples.greedy if c.ok), None)
    firsts = [c.text for c in samples.first[t] if c.ok]
    texts = [c.text for c in samples.seeded[t] if c.ok]
    if greedy_text is None or not samples.greedy_first.ok or not firsts or not texts:
        return CheckRow(f"T={t:g} not silently greedy", False, "missing outputs")
    all_greedy_first = all(f == samples.greedy_first.text for f in firsts)
    all_greedy_text = all(x == greedy_text for x in texts)
    detail = (f"{len(set(firsts))} distinct first tokens over {len(firsts)} seeds "
              f"({sum(f == samples.greedy_first.text for f in firsts)} equal to greedy's); "
              f"{sum(x == greedy_text for x in texts)}/{len(texts)} outputs equal to greedy's")
    if all_greedy_first and not all_greedy_text:
        detail += "; first token is a point mass (a peaked target can do that)"
    return CheckRow(f"T={t:g} not silently greedy", not (all_greedy_first and all_greedy_text), detail)


def aggregate_accept_length(completions: list[Completion]) -> float | None:
    """Summed committed tokens / summed verify steps over the responses' spec_decoding."""
    steps = committed = 0.0
    for c in completions:
        if c.ok and c.spec and c.spec.get("verify_steps"):
            steps += c.spec["verify_steps"]
            committed += c.spec.get("accept_length", 0.0) * c.spec["verify_steps"]
    return committed / steps if steps else None


def check_accept_length(samples: TemperatureSamples) -> CheckRow:
    done = [c for c in samples.all() if c.ok]
    specs = [c.spec for c in done if c.spec]
    if not specs:
        return CheckRow("accept length reported", False, "no response carried spec_decoding")
    algorithms = sorted({s.get("algorithm", "?") for s in specs})
    if algorithms == ["none"]:
        return CheckRow("accept length reported", True, "not speculative (algorithm none)")
    tau = aggregate_accept_length(done)
    ok = tau is not None and tau > 1
    tau_text = "no verify steps" if tau is None else f"{tau:.3f}"
    return CheckRow("accept length > 1", ok, f"algorithm {', '.join(algorithms)}: accept length {tau_text}")


def evaluate(samples: TemperatureSamples) -> list[CheckRow]:
    rows = [check_no_errors(samples), check_greedy_repeats(samples)]
    for t in samples.seeded:
        rows += [check_seed_reproducible(t, samples), check_seeds_differ(t, samples)]
    rows += [check_not_silently_greedy(samples), check_accept_length(samples)]
    return rows


# ---- report ----------------------------------------------------------------------------------

def outputs_table(samples: TemperatureSamples) -> str:
    """Per temperature: tok/s and tokens per request, accept length, and the start of one output."""
    groups = {0.0: samples.greedy, **samples.seeded}
    rows = []
    for t, group in groups.items():
        done = [c for c in group if c.ok]
        tok_s = sum(c.tokens / c.seconds for c in done if c.seconds > 0) / len(done) if done else None
        tokens = sum(c.tokens for c in done) / len(done) if done else None
        start = repr(done[0].text[:48]) if done else "-"
        rows.append([f"{t:g}", len(done), tok_s, tokens, aggregate_accept_length(done), start])
    return format_table(["temp", "requests", "tok/s", "tokens", "accept", "output starts"], rows)


def results_table(rows: list[CheckRow]) -> str:
    return format_table(["check", "result", "detail"],
                        [[r.name, "PASS" if r.passed else "FAIL", r.detail] for r in rows])


def run_temperature_check(config: TemperatureCheckConfig, out=print) -> int:
    """Run and print the check; 0 when every row passes, 1 otherwise, 2 when the server is
    unreachable."""
    config.validate()
    try:
        samples = asyncio.run(collect_samples(config))
    except ServerUnreachable as e:
        print(f"blockspec check temperature: {e}", file=sys.stderr)
        return 2
    rows = evaluate(samples)
    out(outputs_table(samples))
    out("")
    out(results_table(rows))
    passed = all(r.passed for r in rows)
    out("PASS" if passed else "FAIL")
    return 0 if passed else 1
