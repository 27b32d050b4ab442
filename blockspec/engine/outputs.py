"""What the engine hands back: per-step deltas (for streaming) and finished outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from blockspec.logprobs import TokenLogprob


@dataclass
class SpecMetrics:
    """Speculative-decoding counters of one request (conventions: docs/metrics.md).

    accept_length = committed tokens per verify step, bonus included.
    accepted_tokens counts only accepted drafts that were committed (a stop or max_tokens that cuts
    a step short cuts its accepted drafts too), so accepted_tokens <= committed_tokens.
    accepted_per_position[k] = steps whose draft position k (0-based) was accepted and committed.
    verify: how this request's drafts were verified: "greedy" (the argmax walk), "rejection"
    (drafts sampled from q, rejection sampling), "target-only", "none" without speculation, or
    "mixed" for totals over requests verified differently.
    configurations: verify steps per configuration run ("plain", "chain4", "tree7": the adaptive
    policy's choices, engine/spec_policy.py; static runs report the method's one).
    """

    algorithm: str = "none"
    verify_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    committed_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    verify: str = "none"
    configurations: dict[str, int] = field(default_factory=dict)

    @property
    def accept_length(self) -> float:
        return self.committed_tokens / self.verify_steps if self.verify_steps else 0.0

    def record_step(self, drafted: int, accepted: int, committed: int, configuration: str | None = None) -> None:
        """One decode step: `drafted` draft nodes verified, `accepted` of them on the verifier's
        walk, `committed` tokens kept, run as `configuration` (`spec_policy.config_name`). A step
        that verified no drafts (the adaptive policy's plain steps, an n-gram row without a
        match) is counted under its configuration only: it is not a verify step, so τ stays
        the tokens per step that verified drafts (docs/metrics.md)."""
        if configuration is not None:
            counts = self.configurations
            counts[configuration] = counts.get(configuration, 0) + 1
        if not drafted:
            return
        self.verify_steps += 1
        self.committed_tokens += committed
        accepted = min(accepted, committed)  # drafts past a cut were never emitted
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        if len(self.accepted_per_position) < drafted:
            self.accepted_per_position.extend([0] * (drafted - len(self.accepted_per_position)))
        for k in range(accepted):
            self.accepted_per_position[k] += 1

    def merge(self, other: "SpecMetrics") -> None:
        if self.verify != other.verify:
            self.verify = other.verify if self.verify == "none" else "mixed"
        self.verify_steps += other.verify_steps
        self.drafted_tokens += other.drafted_tokens
        self.accepted_tokens += other.accepted_tokens
        self.committed_tokens += other.committed_tokens
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        self.accepted_per_position.extend([0] * (n - len(self.accepted_per_position)))
        for k, c in enumerate(other.accepted_per_position):
            self.accepted_per_position[k] += c
        for name, c in other.configurations.items():
            self.configurations[name] = self.configurations.get(name, 0) + c

    def snapshot(self) -> "SpecMetrics":
        """An independent copy (outputs outlive the step that produced them)."""
        return SpecMetrics(self.algorithm, self.verify_steps, self.drafted_tokens, self.accepted_tokens,
                           self.committed_tokens, list(self.accepted_per_position), verify=self.verify,
                           configurations=dict(self.configurations))

    def to_dict(self) -> dict:
        return {
            "algorithm": self.algorithm,
            "verify": self.verify,
            "verify_steps": self.verify_steps,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accept_length": round(self.accept_length, 4),
            "configurations": dict(self.configurations),
        }


@dataclass
class StepOutput:
    """What one engine step produced for one request: a delta for streaming."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None
    num_prompt_tokens: int
    num_output_tokens: int
    # The request's own metrics object, updated by later steps until the request finishes (then
    # final): read it during the step, or copy it (`snapshot`) to keep it. Not copied per step:
    # at 64 rows two copies a row cost ≈ 0.2 ms of a 2–4 ms step.
    metrics: SpecMetrics
    logprobs: list[TokenLogprob] | None = None  # one per new token, when the request asked (SamplingParams.logprobs)


@dataclass
class RequestOutput:
    """A finished request, as `LLM.generate` returns it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    metrics: SpecMetrics
    logprobs: list[TokenLogprob] | None = None  # one per token of token_ids, when asked for
