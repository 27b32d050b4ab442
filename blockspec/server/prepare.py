"""From a request body's bytes to what the engine needs: parse, validate, tokenise.

All of it is CPU work that grows with the body (a multi-megabyte prompt takes seconds to
tokenise), so the app runs it on a worker thread, never on the event loop: /health and other
streams keep being served meanwhile. Every refusal is an APIError (an OpenAI-style 4xx).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from pydantic import BaseModel, ValidationError

from blockspec.structured_output import StructuredOutput
from blockspec.sampling import SamplingParams
from blockspec.server.constraints import ToolPlan, response_format_constraint, tool_plan
from blockspec.server.errors import APIError, from_validation_error, invalid_request, param_named_in
from blockspec.server.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, unsupported_parameters
from blockspec.server.tool_calls import template_messages
from blockspec.server.tool_formats import tool_format_for

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_CHAT_MAX_TOKENS_CAP = 1024  # chat default: the remaining context, at most this
SAMPLING_FIELDS = frozenset(f.name for f in fields(SamplingParams))

try:  # chat templates are jinja2; their errors (e.g. roles must alternate) are the client's fault
    from jinja2.exceptions import TemplateError as _TemplateError
except ImportError:  # pragma: no cover
    _TemplateError = ValueError


@dataclass
class Prepared:
    """A request that passed every check but the engine's own add_request."""

    body: ChatCompletionRequest | CompletionRequest
    prompts: list[list[int]]
    params: list[SamplingParams]  # one per choice
    prompt_param: str  # the field that errors about the prompt name: "messages" or "prompt"
    tools: ToolPlan | None = None  # the chat request's tools (its replies are parsed for calls)


class RequestPreparer:
    def __init__(self, tokenizer, model_name: str, max_model_len: int, *,
                 allow_special_tokens_in_content: bool = False):
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.allow_special_tokens_in_content = allow_special_tokens_in_content
        self.tool_format = tool_format_for(tokenizer)  # how this model writes tool calls

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist or you do not have access to it.",
                           param="model", code="model_not_found")

    def chat(self, raw: bytes) -> Prepared:
        body = parse_body(raw, ChatCompletionRequest)
        self._check_request(body)
        constraint = response_format_constraint(body)
        tools, call_grammar = tool_plan(body, self.tokenizer.template_reads("tools"), self.tool_format)
        prompt = self._chat_prompt(body.messages, tools.tools if tools else None)
        max_tokens, max_param = _chat_max_tokens(body, len(prompt), self.max_model_len)
        params = _choice_params(body, max_tokens, max_param, call_grammar or constraint,
                                tools.kept_special_token_ids if tools else ())
        self._check_context(prompt, max_tokens, "messages")
        return Prepared(body, [prompt], params, "messages", tools)

    def completion(self, raw: bytes) -> Prepared:
        body = parse_body(raw, CompletionRequest)
        self._check_request(body)
        prompts = self._completion_prompts(body.prompt)
        max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        params = _choice_params(body, max_tokens, "max_tokens", response_format_constraint(body))
        for prompt in prompts:
            self._check_context(prompt, max_tokens, "prompt")
        return Prepared(body, prompts, params, "prompt")

    # ---- checks ----------------------------------------------------------------------------
    def _check_request(self, body: ChatCompletionRequest | CompletionRequest) -> None:
        self.check_model(body.model)
        unsupported = unsupported_parameters(body)
        if unsupported:
            name = unsupported[0]
            raise invalid_request(f"Unsupported parameter: '{name}' is not supported by this server "
                                  f"(blockspec); leave it unset.", name, "unsupported_parameter")
        if body.stream_options is not None and not body.stream:
            raise invalid_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                                  "stream_options")
        if isinstance(body, ChatCompletionRequest) and body.top_logprobs is not None and not body.logprobs:
            raise invalid_request("The 'top_logprobs' parameter is only allowed when 'logprobs' is true.",
                                  "top_logprobs")

    def _check_context(self, prompt: list[int], max_tokens: int, prompt_param: str) -> None:
        limit = self.max_model_len
        if len(prompt) + max_tokens > limit:
            where = "messages" if prompt_param == "messages" else "prompt"
            raise invalid_request(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the {where}, {max_tokens} in the "
                f"completion). Please reduce the length of the {where} or completion.",
                prompt_param, "context_length_exceeded")

    # ---- tokenising ------------------------------------------------------------------------
    def _chat_prompt(self, messages: list[ChatMessage], tools: list[dict] | None = None) -> list[int]:
        """The rendered chat; tools go to the template as transformers passes them."""
        conversation = template_messages(messages)
        extra = {"tools": tools} if tools else {}
        try:
            return list(self.tokenizer.apply_chat_template(
                conversation, add_generation_prompt=True,
                special_tokens_in_content=self.allow_special_tokens_in_content, **extra))
        except (ValueError, _TemplateError) as e:
            raise invalid_request(str(e), "messages") from e

    def _completion_prompts(self, prompt) -> list[list[int]]:
        """A raw prompt is the caller's: special-token text in it is encoded as special tokens."""
        if isinstance(prompt, str):
            prompts = [prompt]
        elif not prompt:
            raise invalid_request("prompt must not be empty", "prompt")
        else:
            prompts = prompt if not isinstance(prompt[0], int) else [prompt]
        encode = self.tokenizer.encode
        ids = [list(encode(p)) if isinstance(p, str) else list(p) for p in prompts]
        if any(not p for p in ids):
            raise invalid_request("prompt must not be empty", "prompt")
        return ids


# ---- parsing ---------------------------------------------------------------------------------

def _unparseable() -> APIError:
    return invalid_request("We could not parse the JSON body of your request. The body must be a "
                           "JSON object.")


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")  # NaN, Infinity: Python's json accepts them


def parse_body(raw: bytes, model: type[BaseModel]):
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep to parse
        raise _unparseable() from None
    if not isinstance(data, dict):
        raise _unparseable()
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e) from None
    except RecursionError:
        raise _unparseable() from None


def _chat_max_tokens(body: ChatCompletionRequest, prompt_len: int, max_model_len: int) -> tuple[int, str]:
    """(max_tokens, the request field it came from); default: the rest of the context, capped."""
    if body.max_completion_tokens is not None:
        return body.max_completion_tokens, "max_completion_tokens"
    if body.max_tokens is not None:
        return body.max_tokens, "max_tokens"
    return max(1, min(max_model_len - prompt_len, DEFAULT_CHAT_MAX_TOKENS_CAP)), "max_tokens"


def _logprobs(body) -> int | None:
    """Alternatives per token the engine reports (None: no logprobs): chat's top_logprobs when
    logprobs is true, the completions' logprobs integer."""
    if isinstance(body, ChatCompletionRequest):
        return (body.top_logprobs or 0) if body.logprobs else None
    return body.logprobs


def _choice_params(body, max_tokens: int, max_tokens_param: str, structured_output: StructuredOutput | None = None,
                   kept_special_token_ids: tuple[int, ...] = ()) -> list[SamplingParams]:
    """SamplingParams of each of the n choices (seed + j for choice j); `kept_special_token_ids`:
    the tool-call markers a tools request's reply keeps for the parser."""
    values = {"temperature": 1.0 if body.temperature is None else body.temperature,
              "top_p": 1.0 if body.top_p is None else body.top_p,
              "top_k": 0 if body.top_k is None else body.top_k,
              "min_p": 0.0 if body.min_p is None else body.min_p,
              "max_tokens": max_tokens, "stop": body.stop, "stop_token_ids": body.stop_token_ids,
              "ignore_eos": body.ignore_eos,
              "presence_penalty": body.presence_penalty or 0.0, "frequency_penalty": body.frequency_penalty or 0.0,
              "repetition_penalty": 1.0 if body.repetition_penalty is None else body.repetition_penalty,
              "logit_bias": body.logit_bias_ids(), "logprobs": _logprobs(body),
              "kept_special_token_ids": kept_special_token_ids}
    seeds = [None if body.seed is None else body.seed + j for j in range(body.n)]
    if structured_output is not None and body.ignore_eos and not body.stop_token_ids:
        raise invalid_request("A constrained reply ends on a stop token: with 'ignore_eos' give 'stop_token_ids'.",
                              "ignore_eos")
    try:
        return [SamplingParams(**values, seed=seed, structured_output=structured_output) for seed in seeds]
    except ValueError as e:
        param = param_named_in(str(e), SAMPLING_FIELDS)
        raise invalid_request(str(e), max_tokens_param if param == "max_tokens" else param) from None
