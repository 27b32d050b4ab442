"""Per-request state, owned by the scheduler and updated by the engine after each step."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from blockspec.engine.outputs import SpecMetrics
from blockspec.kv.allocator import PageTable
from blockspec.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)  # identity: the scheduler's list membership must not compare fields
class Sequence:
    """One request. `tokens` = prompt + committed output.

    `num_cached` tokens have their K/V in the cache. While decoding, the last committed token
    (the root of the next draft) is not cached yet: num_cached == len(tokens) − 1.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    page_table: PageTable
    arrival: int
    tokens: list[int] = field(default_factory=list)
    num_cached: int = 0
    status: Status = Status.WAITING
    finish_reason: str | None = None
    metrics: SpecMetrics = field(default_factory=SpecMetrics)
    num_preemptions: int = 0
    grammar: object = None  # RequestGrammar of a constrained request, at the committed state

    def __post_init__(self):
        if not self.tokens:
            self.tokens = list(self.prompt_ids)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.num_prompt:]

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def prefill_target(self) -> int:
        """Tokens that must be cached before decoding can go on.

        A new request caches its whole prompt and samples its first token; a preempted one
        re-caches everything but its last token, which is already sampled (so its random
        stream is unchanged by preemption).
        """
        return self.num_prompt if self.num_output == 0 else len(self.tokens) - 1

    @property
    def is_prefilling(self) -> bool:
        return self.num_cached < self.prefill_target

    @property
    def last_token(self) -> int:
        return self.tokens[-1]
