"""Request and response shapes of the OpenAI-compatible API (pydantic v2).

Requests forbid unknown fields: a parameter we do not know is an error, never silently dropped.
They are strict: a number must be a JSON number and a bool a JSON bool ("8" is not 8). Ranges
are OpenAI's (temperature 0-2, top_p (0, 1], penalties -2..2, ...), so the published OpenAPI
schema says what is accepted. OpenAI fields that we accept but cannot honour are allowed only at
their neutral value (`unsupported_parameters` lists the ones that are not).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, field_validator
from pydantic_core import PydanticCustomError

MAX_N = 128  # OpenAI's own limit on choices per request
MAX_STOP_STRINGS = 16  # OpenAI allows 4; open-model clients often send a few more
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_TOKENS_LIMIT = 2**31 - 1  # a schema bound only: the context length is the real limit
MAX_LOGIT_BIAS = 1024  # entries; OpenAI names no limit, this bounds the per-step host work
MAX_REPETITION_PENALTY = 100.0  # vLLM has none above 0; a finite bound keeps the schema honest


def _no_lone_surrogates(value: str) -> str:
    # JSON "\ud800" parses to a str that has no UTF-8 form: the tokenizer (and any echo of it
    # in a response) cannot handle it, so it is the client's error, named by its field.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the string contains a lone UTF-16 surrogate (e.g. \\ud800), which is not "
                         "valid Unicode text") from None
    return value


Text = Annotated[str, AfterValidator(_no_lone_surrogates)]
TokenId = Annotated[int, Field(ge=0)]
PositiveTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)]
_STOP_STRING_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS}
# Checked by _check_stop (clearer errors than a constrained union); the schema says the same.
StopStrings = Annotated[Text | list[Text] | None, WithJsonSchema({"anyOf": [
    _STOP_STRING_SCHEMA, {"type": "array", "items": _STOP_STRING_SCHEMA, "maxItems": MAX_STOP_STRINGS},
    {"type": "null"}]})]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # OpenAI padding option; we never pad


class TextContentPart(_Strict):
    type: Literal["text"]
    text: Text


# OpenAI's (and vLLM's) non-text content parts. blockspec serves text models (a multimodal
# checkpoint loads its text model only), so these are refused by name, not as a bad "type".
MEDIA_PART_TYPES = frozenset({"image_url", "input_image", "image", "video_url", "video", "input_audio",
                              "audio_url", "audio", "file", "input_file"})

FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]  # OpenAI's rule for names


class FunctionCall(_Strict):
    name: FunctionName
    arguments: Text  # JSON text, as the API returned it


class ToolCall(_Strict):
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextContentPart] | None = None
    name: Text | None = None
    refusal: Text | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: Text | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _refuse_media(cls, content: Any) -> Any:
        for index, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind in MEDIA_PART_TYPES:
                raise PydanticCustomError(
                    "unsupported_content",
                    "content part {index} is of type '{kind}': this server accepts text content only "
                    "(images, video, audio and files are not supported); send 'text' parts",
                    {"index": index, "kind": kind})
        return content

    def text(self) -> str:
        """The message content as one string (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionDefinition(_Strict):
    name: FunctionName
    description: Text | None = None
    parameters: dict[Text, Any] | None = None  # a JSON schema (checked when the grammar is built)
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: FunctionName


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JSONSchemaSpec(_Strict):
    name: FunctionName
    description: Text | None = None
    schema_: dict[Text, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextFormat(_Strict):
    type: Literal["text"]


class JSONObjectFormat(_Strict):
    type: Literal["json_object"]


class JSONSchemaFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


ResponseFormat = Annotated[TextFormat | JSONObjectFormat | JSONSchemaFormat, Field(discriminator="type")]


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs` extension: exactly one of the fields."""

    json_: dict[Text, Any] | None = Field(default=None, alias="json")  # a JSON schema
    regex: Text | None = None
    choice: list[Text] | None = None
    grammar: Text | None = None  # EBNF (xgrammar's GBNF dialect, root rule `root`)


class _SamplingFields(_Strict):
    """Fields shared by both endpoints, in OpenAI's spelling and ranges."""

    model: Text
    n: int = Field(default=1, ge=1, le=MAX_N)
    max_tokens: PositiveTokens | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)  # not OpenAI; common in open engines; -1 or 0: off
    min_p: float | None = Field(default=None, ge=0, le=1)  # not OpenAI; common in open engines
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)  # torch seeds are 64-bit
    stop: StopStrings = None
    stop_token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Accepted, no effect on generation.
    user: Text | None = None
    metadata: dict[Text, Text] | None = Field(default=None, max_length=16)  # OpenAI: 16 pairs
    store: bool | None = None
    service_tier: Text | None = None
    safety_identifier: Text | None = None
    prompt_cache_key: Text | None = None
    # Applied to the target's logits at every verify position (docs/logits_processing.md).
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    # Token ids (as JSON object keys, so strings of digits) -> bias; ids past the vocabulary are
    # the engine's 400 (it knows the vocabulary).
    logit_bias: dict[Text, Annotated[float, Field(ge=-100, le=100)]] | None = Field(default=None,
                                                                                  max_length=MAX_LOGIT_BIAS)
    repetition_penalty: float | None = Field(default=None, gt=0, le=MAX_REPETITION_PENALTY)  # not OpenAI; vLLM's
    structured_outputs: StructuredOutputs | None = None  # not OpenAI: vLLM's extension

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop):
        # An empty stop string matches at once (a one-token completion); unbounded lists are
        # a per-token cost on the engine thread.
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stops)}")
        for s in stops:
            if not s:
                raise ValueError("stop strings must not be empty")
            if len(s) > MAX_STOP_STRING_CHARS:
                raise ValueError(f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters, "
                                 f"got {len(s)}")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, bias):
        for key in bias or {}:
            if not key.isdigit() or not key.isascii():
                raise ValueError(f"logit_bias keys must be token ids (non-negative integers), got {key!r}")
        return bias

    def logit_bias_ids(self) -> dict[int, float] | None:
        return None if not self.logit_bias else {int(k): v for k, v in self.logit_bias.items()}


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: PositiveTokens | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)  # needs logprobs=true (RequestPreparer)
    tools: list[Tool] | None = Field(default=None, max_length=128)  # OpenAI's limit
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: ResponseFormat | None = None
    modalities: list[Text] | None = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Text | None = None
    verbosity: Text | None = None
    web_search_options: Any = None


PromptInput = Text | list[Text] | list[int] | list[list[int]]


class CompletionRequest(_SamplingFields):
    prompt: PromptInput = Field(description="A raw prompt is the caller's: special-token text in it "
                                            "is encoded as special tokens (no chat template).")
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool | None = None
    best_of: int | None = Field(default=None, ge=1, le=20)
    suffix: Text | None = None


def _is_unset(value: Any) -> bool:
    return value is None or value == [] or value == {}


# field -> predicate "this value is neutral, i.e. we honour it by doing nothing"
_NEUTRAL_VALUES = {
    "functions": _is_unset,
    "function_call": lambda v: v is None or v == "none",
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
    verify: str
    verify_steps: int
    drafted_tokens: int
    accepted_tokens: int
    accept_length: float
    configurations: dict[str, int]   # verify steps per configuration run (docs/adaptive.md)


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
