"""`blockspec check lossless`: a statistical test that speculative sampling is the target's law.

For each sampling setting, `num_samples` unseeded speculative requests (the engine's own
generator, so the verifier named by `verify` decides every token: seeded requests sample by the
exponential race, blockspec/seeded_sampling.py) generate `num_tokens` tokens after one prompt.
When vocab^num_tokens is small enough the target's joint law of those tokens is enumerated exactly from transformers' forward (an implementation independent of the
engine) and the samples get a chi-square goodness-of-fit test; otherwise the speculative
samples are compared with plain samples of the same target (`LLM(model)`, seeds offset so the
samples are independent) by a two-sample chi-square test.

A test that cannot fail proves nothing, so each setting also runs a negative control: the
reference side is deliberately biased (the target at `control_factor` × the temperature).
The tool reports PASS only when every setting passes AND every control is detected (p < α);
an undetected control means the test lacks power at this sample size, and the tool says so.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace

from blockspec.bench import SpecEngineArgs, format_table
from blockspec.sampling import SamplingParams
from blockspec.validation.lossless import (ChiSquareResult, chi_square_against_law, chi_square_two_sample,
                                           exact_joint_law, sample_continuations)

MAX_EXACT_CELLS = 100_000
PLAIN_SEED_OFFSET = 1_000_000_000
CONTROL_SEED_OFFSET = 2_000_000_000
DEFAULT_PROMPT = "the time of day"
DEFAULT_SETTINGS = (
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8, min_p=0.05),
)


@dataclass
class LosslessCheckConfig(SpecEngineArgs):
    verify: str = "target-only"  # or "rejection"
    prompt: str = DEFAULT_PROMPT
    prompt_ids: list[int] | None = None  # overrides `prompt`
    num_tokens: int = 3
    num_samples: int = 20_000
    settings: list[SamplingParams] = field(default_factory=lambda: list(DEFAULT_SETTINGS))
    alpha: float = 1e-3
    control_factor: float = 1.1
    mode: str = "auto"  # "exact", "two-sample"
    max_running_requests: int = 1024

    def validate(self) -> None:
        if self.spec == "none":
            raise ValueError("check lossless tests a speculative method: --spec must not be none")
        if self.num_tokens < 1 or self.num_samples < 100:
            raise ValueError("--num-tokens must be >= 1 and --num-samples >= 100")
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"--alpha must be in (0, 0.5), got {self.alpha}")
        if self.control_factor <= 0 or self.control_factor == 1:
            raise ValueError("--control-factor must be positive and not 1 (the control must be biased)")
        if self.mode not in ("auto", "exact", "two-sample"):
            raise ValueError(f"--mode must be auto, exact or two-sample, got {self.mode!r}")
        if not self.settings:
            raise ValueError("no sampling settings")
        for s in self.settings:
            if s.temperature == 0:
                raise ValueError("temperature 0 is greedy (a point mass): the test needs temperatures > 0")


@dataclass
class SettingResult:
    setting: SamplingParams
    mode: str
    test: ChiSquareResult
    control: ChiSquareResult
    accept_length: float
    accepted_tokens: int
    seconds: float


def settings_from_lists(temperatures: list[float] | None, top_ps: list[float] | None, top_ks: list[int] | None,
                        min_ps: list[float] | None) -> list[SamplingParams]:
    """Zip the lists (a list of one value applies to every setting); all None: the default set."""
    lists = {"temperature": temperatures, "top_p": top_ps, "top_k": top_ks, "min_p": min_ps}
    given = {k: v for k, v in lists.items() if v}
    if not given:
        return list(DEFAULT_SETTINGS)
    n = max(len(v) for v in given.values())
    for name, values in given.items():
        if len(values) not in (1, n):
            raise ValueError(f"--{name.replace('_', '-')} has {len(values)} values; give 1 or {n}")
    return [SamplingParams(**{k: v[i if len(v) > 1 else 0] for k, v in given.items()}) for i in range(n)]


def describe(setting: SamplingParams) -> str:
    parts = [f"T={setting.temperature:g}"]
    if setting.top_k:
        parts.append(f"top_k={setting.top_k}")
    if setting.top_p < 1:
        parts.append(f"top_p={setting.top_p:g}")
    if setting.min_p > 0:
        parts.append(f"min_p={setting.min_p:g}")
    return " ".join(parts)


# ---- engines and references ------------------------------------------------------------------

def _engine_sizes(config: LosslessCheckConfig, prompt_len: int) -> dict:
    """Room for many short requests at once (the check runs thousands of them)."""
    running = min(config.num_samples, config.max_running_requests)
    lookahead = 2 * max(config.block_size or 16, (config.budget or 0) + 1) + 8
    return {"max_running_requests": running, "max_prefill_tokens": running * prompt_len,
            "kv_cache_tokens": running * (prompt_len + config.num_tokens + lookahead), "page_size": 4}


def build_spec_llm(config: LosslessCheckConfig, prompt_len: int):
    return config.spec_llm(spec_verify=config.verify, **_engine_sizes(config, prompt_len))


def build_plain_llm(config: LosslessCheckConfig, prompt_len: int):
    return config.plain_llm(**_engine_sizes(config, prompt_len))


def transformers_next_logits(model_dir: str):
    """next_logits(list of sequences) -> [N, V] from transformers' own forward, in float32 on CPU."""
    import torch
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def next_logits(seqs: list[list[int]]):
        with torch.no_grad():
            return hf(torch.tensor(seqs)).logits[:, -1]
    return next_logits


def choose_mode(config: LosslessCheckConfig, vocab_size: int) -> str:
    if config.mode != "auto":
        return config.mode
    return "exact" if vocab_size ** config.num_tokens <= MAX_EXACT_CELLS else "two-sample"


def biased(setting: SamplingParams, factor: float) -> SamplingParams:
    """The negative control's reference: the same filters at a deliberately wrong temperature."""
    return replace(setting, temperature=setting.temperature * factor)


# ---- the test --------------------------------------------------------------------------------

class _Checker:
    def __init__(self, config: LosslessCheckConfig):
        self.config = config
        self.spec_llm = None
        self.prompt: list[int] = []
        self.mode = ""
        self._next_logits = None
        self._plain_llm = None

    def setup(self) -> None:
        c = self.config
        from blockspec.tokenizer import Tokenizer
        self.prompt = list(c.prompt_ids) if c.prompt_ids else list(Tokenizer.load(c.model).encode(c.prompt))
        if not self.prompt:
            raise ValueError("the prompt encodes to no tokens")
        self.spec_llm = build_spec_llm(c, len(self.prompt))
        vocab = self.spec_llm.engine.model_config.vocab_size
        if any(not 0 <= t < vocab for t in self.prompt):
            raise ValueError(f"prompt ids must be in [0, {vocab})")
        self.mode = choose_mode(c, vocab)
        if self.mode == "exact":
            self._next_logits = transformers_next_logits(c.model)
        else:
            self._plain_llm = build_plain_llm(c, len(self.prompt))

    def run_setting(self, setting: SamplingParams) -> SettingResult:
        from blockspec.llm import LLM
        c = self.config
        start = time.perf_counter()
        spec_outputs = self._spec_samples(setting)
        samples = [tuple(o.token_ids[:c.num_tokens]) for o in spec_outputs]
        if self.mode == "exact":
            vocab = self.spec_llm.engine.model_config.vocab_size
            law = exact_joint_law(self._next_logits, self.prompt, setting, vocab, c.num_tokens)
            control_law = exact_joint_law(self._next_logits, self.prompt, biased(setting, c.control_factor), vocab,
                                          c.num_tokens)
            test, control = chi_square_against_law(samples, law), chi_square_against_law(samples, control_law)
        else:
            plain = sample_continuations(self._plain_llm, self.prompt, setting, c.num_samples, c.num_tokens,
                                         seed_offset=PLAIN_SEED_OFFSET)
            shifted = sample_continuations(self._plain_llm, self.prompt, biased(setting, c.control_factor),
                                           c.num_samples, c.num_tokens, seed_offset=CONTROL_SEED_OFFSET)
            test, control = chi_square_two_sample(samples, plain), chi_square_two_sample(samples, shifted)
        spec = LLM.aggregate_metrics(spec_outputs)
        return SettingResult(setting, self.mode, test, control, spec.accept_length, spec.accepted_tokens,
                             time.perf_counter() - start)

    def _spec_samples(self, setting: SamplingParams):
        """Unseeded speculative requests (module docstring), whole outputs kept for their metrics."""
        fields = {k: getattr(setting, k) for k in ("temperature", "top_p", "top_k", "min_p")}
        plist = [SamplingParams(**fields, max_tokens=self.config.num_tokens, ignore_eos=True)
                 for i in range(self.config.num_samples)]
        return self.spec_llm.generate([self.prompt] * self.config.num_samples, plist)


@dataclass
class LosslessReport:
    results: list[SettingResult]
    alpha: float
    control_factor: float

    @property
    def tests_pass(self) -> bool:
        return all(r.test.p_value > self.alpha for r in self.results)

    @property
    def controls_detected(self) -> bool:
        return all(r.control.p_value < self.alpha for r in self.results)

    @property
    def passed(self) -> bool:
        return self.tests_pass and self.controls_detected

    def verdict(self) -> str:
        if not self.tests_pass:
            return "FAIL: speculative samples do not follow the target's law"
        if not self.controls_detected:
            return (f"FAIL: the test lacks power: a negative control (temperature x{self.control_factor:g}) "
                    "was not detected; use more samples or fewer tokens")
        return "PASS"

    def table(self) -> str:
        rows = []
        for r in self.results:
            rows.append([describe(r.setting), r.mode, r.test.statistic, r.test.dof, f"{r.test.p_value:.3g}",
                         "PASS" if r.test.p_value > self.alpha else "FAIL", r.accept_length])
            rows.append([f"  control x{self.control_factor:g}", r.mode, r.control.statistic, r.control.dof,
                         f"{r.control.p_value:.3g}",
                         "detected" if r.control.p_value < self.alpha else "NOT DETECTED", None])
        return format_table(["setting", "mode", "chi2", "dof", "p-value", "result", "accept"], rows)

    def to_dict(self) -> dict:
        def stat(s: ChiSquareResult) -> dict:
            return {"statistic": s.statistic, "dof": s.dof, "p_value": s.p_value, "num_samples": s.num_samples}
        return {"alpha": self.alpha, "control_factor": self.control_factor, "passed": self.passed,
                "verdict": self.verdict(),
                "settings": [{"setting": describe(r.setting), "mode": r.mode, "test": stat(r.test),
                              "control": stat(r.control), "accept_length": r.accept_length,
                              "accepted_tokens": r.accepted_tokens, "seconds": r.seconds}
                             for r in self.results]}


def check_lossless(config: LosslessCheckConfig) -> LosslessReport:
    config.validate()
    checker = _Checker(config)
    checker.setup()
    return LosslessReport([checker.run_setting(s) for s in config.settings], config.alpha, config.control_factor)


def run_lossless_check(config: LosslessCheckConfig, output: str | None = None, out=print) -> int:
    """Run, print the table and verdict (and write JSON to `output`); 0 only on PASS."""
    report = check_lossless(config)
    out(f"{config.num_samples} samples of {config.num_tokens} tokens per setting, alpha={config.alpha:g}, "
        f"spec={config.spec}, verify={config.verify}")
    out(report.table())
    if any(r.accepted_tokens == 0 for r in report.results):
        out("note: no draft token was accepted in some setting, so the verifier's accept path went untested there")
    out(report.verdict())
    if output:
        with open(output, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
    return 0 if report.passed else 1
