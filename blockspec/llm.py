"""Offline API shaped like vLLM's: `LLM(model=...).generate(prompts, params)`."""

from __future__ import annotations

from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.engine.outputs import RequestOutput, SpecMetrics
from blockspec.sampling import SamplingParams


def engine_config(model: str | None = None, *, spec: str | None = None, draft_model: str | None = None,
                  budget: int | None = None, topk: int | None = None, **settings) -> EngineConfig:
    """The EngineConfig of `LLM(...)` and of every CLI command (`blockspec.engine_args`).

    model None: the bundled pair (its drafter, and spec dflash when it ships one). spec None:
    "none". budget / topk are the DDTree names of tree_budget / tree_topk. Every other keyword is
    an EngineConfig field, passed through unchanged (an unknown name is a TypeError).
    """
    if model is None:
        from blockspec.bundled import default_model  # the bundled pair (issue 5)
        model, draft_model, spec = default_model(draft_model, spec)
    for alias, value in (("budget", budget), ("topk", topk)):
        if value is not None:
            field = "tree_" + alias
            if settings.get(field) is not None:
                raise TypeError(f"give {alias} or {field}, not both")
            settings[field] = value
    return EngineConfig(model=str(model), spec=spec or "none", draft_model=draft_model, **settings)


class LLM:
    """All prompts of one `generate` call run together as one continuously batched set.

    `LLM(model=None, **settings)`: the settings are `engine_config`'s (EngineConfig fields, with
    budget / topk for DDTree), e.g. dtype, device, draft_model, spec, block_size, spec_verify,
    tensor_parallel_size. With worker processes (tensor_parallel_size > 1) call `close()` or use
    `with LLM(...) as llm:`.
    """

    def __init__(self, model: str | None = None, **settings):
        self.engine = Engine(engine_config(model, **settings))
        self.tokenizer = self.engine.tokenizer
        self._counter = 0

    @classmethod
    def from_config(cls, config: EngineConfig) -> "LLM":
        """An LLM on a new engine built from `config`."""
        return cls.from_engine(Engine(config))

    @classmethod
    def from_engine(cls, engine: Engine) -> "LLM":
        """Wrap an already built engine (custom proposers, tests)."""
        llm = cls.__new__(cls)
        llm.engine, llm.tokenizer, llm._counter = engine, engine.tokenizer, 0
        return llm

    def close(self) -> None:
        """Release the engine's worker processes (tensor parallelism); idempotent."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        """prompts: a string, a token-id list, or a list of either."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompt_ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        return self._run(prompt_ids, params)

    def chat(self, conversations, params: SamplingParams | list[SamplingParams] | None = None,
             **template_kwargs) -> list[RequestOutput]:
        """conversations: one message list or a list of them."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        prompt_ids = [self.tokenizer.apply_chat_template(c, add_generation_prompt=True, **template_kwargs)
                      for c in conversations]
        return self._run(prompt_ids, params)

    def _run(self, prompt_ids: list[list[int]], params) -> list[RequestOutput]:
        if params is None:
            params = SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompt_ids)
        if len(plist) != len(prompt_ids):
            raise ValueError(f"params has {len(plist)} entries for {len(prompt_ids)} prompts")
        ids = []
        try:
            for p, sp in zip(prompt_ids, plist):
                rid = f"llm-{self._counter}"
                self._counter += 1
                self.engine.add_request(rid, p, sp)
                ids.append(rid)
            done: dict[str, RequestOutput] = {}
            tokens: dict[str, list[int]] = {r: [] for r in ids}
            texts: dict[str, list[str]] = {r: [] for r in ids}
            logprobs: dict[str, list] = {r: [] for r in ids}
            index = {r: i for i, r in enumerate(ids)}
            while len(done) < len(ids):
                for out in self.engine.step():
                    tokens[out.request_id].extend(out.new_token_ids)
                    texts[out.request_id].append(out.new_text)
                    logprobs[out.request_id].extend(out.logprobs or [])
                    if out.finished:
                        i = index[out.request_id]
                        done[out.request_id] = RequestOutput(
                            out.request_id, prompt_ids[i], tokens[out.request_id],
                            "".join(texts[out.request_id]), out.finish_reason, out.metrics,
                            logprobs[out.request_id] if plist[i].logprobs is not None else None)
        except BaseException:
            for rid in ids:  # nothing left allocated when a call fails or is interrupted
                self.engine.abort_request(rid)
            raise
        return [done[r] for r in ids]

    @staticmethod
    def aggregate_metrics(outputs: list[RequestOutput]) -> SpecMetrics:
        total = SpecMetrics(algorithm=outputs[0].metrics.algorithm if outputs else "none")
        for o in outputs:
            total.merge(o.metrics)
        return total
