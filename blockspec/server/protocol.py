"""Request and response shapes of the OpenAI-compatible API (pydantic v2).

Requests forbid unknown fields: a parameter we do not know is an error, never silently dropped.
OpenAI fields that we accept but cannot honour are allowed only at their neutral value
(`unsupported_parameters` lists the ones that are not).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 128  # OpenAI's own limit on choices per request


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # OpenAI padding option; we never pad


class TextContentPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message content as one string (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class _SamplingFields(_Strict):
    """Fields shared by both endpoints, in OpenAI's spelling."""

    model: str
    n: int = Field(default=1, ge=1, le=MAX_N)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # not OpenAI; common in open engines
    min_p: float | None = None  # not OpenAI; common in open engines
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)  # torch seeds are 64-bit
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Accepted, no effect on generation.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # Accepted only at their neutral value (see unsupported_parameters).
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    repetition_penalty: float | None = None  # not OpenAI; sent at 1.0 by vLLM's benchmark client


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: Any = None


PromptInput = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(_SamplingFields):
    prompt: PromptInput
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None


def _is_unset(value: Any) -> bool:
    return value is None or value == [] or value == {}


# field -> predicate "this value is neutral, i.e. we honour it by doing nothing"
_NEUTRAL_VALUES = {
    "presence_penalty": lambda v: v is None or v == 0,
    "frequency_penalty": lambda v: v is None or v == 0,
    "logit_bias": _is_unset,
    "repetition_penalty": lambda v: v is None or v == 1,
    "logprobs": lambda v: v is None or v is False,
    "top_logprobs": lambda v: v is None or v == 0,
    "tools": _is_unset,
    "tool_choice": lambda v: v is None or v == "none",
    "functions": _is_unset,
    "function_call": lambda v: v is None or v == "none",
    "response_format": lambda v: v is None or v == {"type": "text"},
    "modalities": lambda v: v is None or v == ["text"],
    "audio": lambda v: v is None,
    "prediction": lambda v: v is None,
    "reasoning_effort": lambda v: v is None,
    "web_search_options": lambda v: v is None,
    "echo": lambda v: v is None or v is False,
    "best_of": lambda v: v is None or v == 1,
    "suffix": lambda v: v is None or v == "",
}


def unsupported_parameters(request: BaseModel) -> list[str]:
    """Names of fields set to a value this server cannot honour."""
    present = type(request).model_fields
    return [name for name, is_neutral in _NEUTRAL_VALUES.items()
            if name in present and not is_neutral(getattr(request, name))]


# ---- responses -------------------------------------------------------------------------------

class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class SpecDecodingInfo(BaseModel):
    algorithm: str
    verify_steps: int
    drafted_tokens: int
    accepted_tokens: int
    accept_length: float


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "blockspec"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
