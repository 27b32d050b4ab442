"""A fake engine with the real Engine's interface, for server tests.

It "generates" by walking a fixed word list, one word per token, so outputs are easy to
predict: greedy requests start at a position derived from the prompt, sampled requests draw
words from `random.Random(seed)` (so the seed is visible in the text). With a speculative
algorithm it commits 1-3 tokens per step and records them in SpecMetrics like a verifier
would. Stop strings are applied with hold-back of partial matches, like the real engine.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from blockspec.engine.outputs import SpecMetrics, StepOutput

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliett", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo")
SPECIAL = ("<eos>", "<unk>", "<system>", "<user>", "<assistant>")
EOS_ID, UNK_ID = 0, 1
FIRST_WORD_ID = len(SPECIAL)


class FakeTokenizer:
    """Whitespace tokenizer over SPECIAL + WORDS; every token decodes to ' word'."""

    def __init__(self, has_chat_template: bool = True):
        self.vocab = list(SPECIAL) + list(WORDS)
        self._ids = {w: i for i, w in enumerate(self.vocab)}
        self.eos_token_ids = [EOS_ID]
        self.has_chat_template = has_chat_template

    @property
    def special_token_ids(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(SPECIAL)}

    def template_reads(self, variable: str) -> bool:
        return False  # the fake template renders roles and content only (no tools)

    def encode(self, text: str) -> list[int]:
        return [self._ids.get(word, UNK_ID) for word in text.split()]

    def encode_as_text(self, text: str) -> list[int]:
        """Like encode, but special-token words are ordinary (unknown) words."""
        return [i if i >= FIRST_WORD_ID else UNK_ID for i in self.encode(text)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(" " + self.vocab[i] for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, *,
                            special_tokens_in_content: bool = False) -> list[int]:
        if not self.has_chat_template:
            raise ValueError("this model has no chat template")
        encode_content = self.encode if special_tokens_in_content else self.encode_as_text
        ids: list[int] = []
        for message in messages:
            ids.append(self._ids.get(f"<{message['role']}>", self._ids["<user>"]))
            ids.extend(encode_content(message["content"]))
        if add_generation_prompt:
            ids.append(self._ids["<assistant>"])
        return ids


@dataclass
class FakeStats:
    num_running: int
    num_waiting: int
    kv_tokens_used: int
    kv_tokens_total: int


@dataclass
class _Request:
    request_id: str
    prompt: list[int]
    params: object
    rng: random.Random
    metrics: SpecMetrics
    output: list[int] = field(default_factory=list)
    text: str = ""
    emitted: int = 0


class FakeEngine:
    def __init__(self, *, model_name: str = "fake-model", max_model_len: int = 256,
                 spec_algorithm: str = "ngram", max_running: int = 4, step_delay: float = 0.0,
                 kv_tokens_total: int = 4096, has_chat_template: bool = True):
        self.tokenizer = FakeTokenizer(has_chat_template)
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.spec_algorithm = spec_algorithm
        self.max_running = max_running
        self.step_delay = step_delay
        self.kv_tokens_total = kv_tokens_total
        self._requests: dict[str, _Request] = {}  # arrival order = scheduling order
        self.num_steps = 0
        self.fail_next_step = False
        self.added: list[str] = []
        self.aborted: list[str] = []
        self.calling_threads: set[int] = set()

    def _called(self) -> None:
        self.calling_threads.add(threading.get_ident())

    # ---- the Engine interface ---------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params) -> None:
        self._called()
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("prompt is empty")
        if any(not 0 <= t < len(self.tokenizer.vocab) for t in prompt_token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {len(self.tokenizer.vocab)})")
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise ValueError("prompt + max_tokens exceeds the context length")
        rng = random.Random(params.seed) if params.seed is not None else random.Random()
        self._requests[request_id] = _Request(request_id, list(prompt_token_ids), params, rng,
                                              SpecMetrics(algorithm=self.spec_algorithm))
        self.added.append(request_id)

    def abort_request(self, request_id: str) -> None:
        self._called()
        self.aborted.append(request_id)
        self._requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        self._called()
        return bool(self._requests)

    def stats(self) -> FakeStats:
        self._called()
        running = self._running()
        used = sum(len(r.prompt) + len(r.output) for r in running)
        return FakeStats(len(running), len(self._requests) - len(running), used, self.kv_tokens_total)

    def step(self) -> list[StepOutput]:
        self._called()
        if self.step_delay:
            time.sleep(self.step_delay)
        self.num_steps += 1
        if self.fail_next_step:
            error, self.fail_next_step = self.fail_next_step, False
            raise error if isinstance(error, BaseException) else RuntimeError("injected step failure")
        return [self._advance(r) for r in self._running()]

    # ---- generation ---------------------------------------------------------------------------
    def _running(self) -> list[_Request]:
        return list(self._requests.values())[: self.max_running]

    def _next_word_id(self, r: _Request) -> int:
        if r.params.temperature == 0:
            start = sum(r.prompt) % len(WORDS)
            return FIRST_WORD_ID + (start + len(r.output)) % len(WORDS)
        return FIRST_WORD_ID + r.rng.randrange(len(WORDS))

    def _advance(self, r: _Request) -> StepOutput:
        speculative = self.spec_algorithm != "none"
        # 1, 2, 3, 1, ... tokens per step of this request: independent of the batch, like a real verifier
        want = 1 + r.metrics.verify_steps % 3 if speculative else 1
        new_ids: list[int] = []
        reason = None
        for _ in range(want):
            token = self._next_word_id(r)
            new_ids.append(token)
            r.output.append(token)
            r.text += self.tokenizer.decode([token])
            reason = self._stop_reason(r)
            if reason:
                break
        if speculative:
            r.metrics.record_step(drafted=3, accepted=len(new_ids) - 1, committed=len(new_ids))
        hold = 0 if reason else _partial_stop_suffix(r.text, r.params.stop or [])
        new_text = r.text[r.emitted:len(r.text) - hold]
        r.emitted += len(new_text)
        if reason:
            del self._requests[r.request_id]
        return StepOutput(r.request_id, new_ids, new_text, reason is not None, reason,
                          len(r.prompt), len(r.output), r.metrics)

    def _stop_reason(self, r: _Request) -> str | None:
        for stop in r.params.stop or []:
            at = r.text.find(stop)
            if at != -1:
                r.text = r.text[:at]
                return "stop"
        if len(r.output) >= r.params.max_tokens:
            return "length"
        return None


def _partial_stop_suffix(text: str, stops: list[str]) -> int:
    """Length of the longest end of `text` that could still grow into a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
