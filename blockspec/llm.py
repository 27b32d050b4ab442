"""Offline API shaped like vLLM's: `LLM(model=...).generate(prompts, params)`."""

from __future__ import annotations

from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.engine.outputs import RequestOutput, SpecMetrics
from blockspec.sampling import SamplingParams


class LLM:
    """All prompts of one `generate` call run together as one continuously batched set."""

    def __init__(self, model: str | None = None, *, dtype: str = "float32", device: str = "cpu",
                 draft_model: str | None = None, spec: str | None = None, block_size: int | None = None,
                 budget: int | None = None, topk: int | None = None, **engine_kwargs):
        if model is None:
            from blockspec.bundled import default_model  # the bundled pair (issue 5)
            model, draft_model, spec = default_model(draft_model, spec)
        self.engine = Engine(EngineConfig(model=str(model), dtype=dtype, device=device,
                                          spec=spec or "none", draft_model=draft_model,
                                          block_size=block_size, tree_budget=budget, tree_topk=topk,
                                          **engine_kwargs))
        self.tokenizer = self.engine.tokenizer
        self._counter = 0

    @classmethod
    def from_engine(cls, engine: Engine) -> "LLM":
        """Wrap an already built engine (custom proposers, tests)."""
        llm = cls.__new__(cls)
        llm.engine, llm.tokenizer, llm._counter = engine, engine.tokenizer, 0
        return llm

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
            while len(done) < len(ids):
                for out in self.engine.step():
                    tokens[out.request_id].extend(out.new_token_ids)
                    texts[out.request_id].append(out.new_text)
                    if out.finished:
                        done[out.request_id] = RequestOutput(
                            out.request_id, prompt_ids[ids.index(out.request_id)], tokens[out.request_id],
                            "".join(texts[out.request_id]), out.finish_reason, out.metrics)
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
