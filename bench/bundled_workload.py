"""The bundled pair and the held-out ShareGPT requests that the adaptive policy's bench scripts
(accept_traces, policy_ab, policy_live_time) run: one place for the workload they compare. (Their callers put the repository on sys.path.)"""

from __future__ import annotations

from pathlib import Path

from blockspec.bench.datasets import load_dataset
from blockspec.bench.offline import prompt_token_ids
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams

BUNDLED = Path(__file__).resolve().parents[1] / "blockspec" / "bundled"


def bundled_dflash(**settings) -> LLM:
    """The bundled target with its DFlash drafter (`settings`: LLM's, e.g. device, spec_policy)."""
    return LLM(str(BUNDLED / "target"), spec="dflash", draft_model=str(BUNDLED / "drafter"), **settings)


def sharegpt_requests(llm: LLM, prompts: int, max_tokens: int, temperature: float):
    """(token ids, sampling params) of the first `prompts` held-out ShareGPT prompts, each cut
    to fit `max_tokens` of output in the model's context."""
    ids = [prompt_token_ids(p, llm.tokenizer, llm.engine.max_model_len - max_tokens - 32)
           for p in load_dataset("sharegpt", prompts, 0)]
    return ids, [SamplingParams(temperature=temperature, max_tokens=max_tokens)] * len(ids)
