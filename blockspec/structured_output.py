"""What a request's output must match: a JSON schema, a regex, an EBNF grammar, a choice of
strings or an xgrammar structural tag (tool calls). One definition, shared by the server's
`response_format` / `structured_outputs` / `tool_choice` and by `SamplingParams`.

A spec is checked when it is made (`StructuredOutput(...)` builds the tokenizer-free grammar,
so a bad schema or regex is a ValueError naming the field, before a request reaches the
engine); the engine compiles it against its vocabulary (`grammar/matcher.py`).

JSON is generated without free whitespace (`any_whitespace=False`: `", "` and `": "` between
items): a model sampled at T = 1 could otherwise spend its whole budget on whitespace, and
the text still parses to the same value.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

KINDS = ("json", "regex", "grammar", "choice", "structural_tag")
# Any JSON object, `response_format: {"type": "json_object"}`.
JSON_OBJECT_SCHEMA = {"type": "object"}

# xgrammar's C++ errors begin with "[hh:mm:ss] /path/file.cc:123: "; the rest is the message.
_CPP_PREFIX = re.compile(r"^\[[\d:]+\]\s*\S+?:\d+:\s*")


# What a rewritten bounded string may hold: printable ASCII but the quote and the backslash, and
# every other code point from U+00A0 but the surrogates, as explicit ranges (a negated class is
# lowered by xgrammar's regex path to bytes that admit overlong UTF-8 such as F0 8A 8A 8A, which
# decodes to four U+FFFD and breaks the length bound; explicit ranges are lowered exactly).
_JSON_TEXT_CHARS = " !#-\\[\\]-~\u00a0-\ud7ff\ue000-\uffff\U00010000-\U0010ffff"


def bounded_strings_as_patterns(schema):
    """`schema` with every `{"type": "string", "minLength"/"maxLength": n}` that has no pattern or
    format rewritten as the same bound on a `pattern` of plain text characters.

    xgrammar (≤ 0.2.9, upstream issue #800) lowers a length-bounded string to a character class
    that lets raw control characters (U+0000–U+001F) through, which JSON forbids unescaped:
    strict parsers reject such output. Its `pattern` path is JSON-aware. The rewritten schema
    accepts a subset of the original's strings (no control characters, quotes, backslashes or
    escapes — the bounded path cannot emit escapes either), so the output still validates."""
    if isinstance(schema, list):
        return [bounded_strings_as_patterns(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bounded_strings_as_patterns(v) for k, v in schema.items()}
    low, high = out.get("minLength"), out.get("maxLength")
    bounds_are_ints = all(b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in (low, high))
    if (out.get("type") == "string" and (low is not None or high is not None) and bounds_are_ints
            and "pattern" not in out and "format" not in out):
        out.pop("minLength", None)
        out.pop("maxLength", None)
        out["pattern"] = f"^[{_JSON_TEXT_CHARS}]{{{low or 0},{'' if high is None else high}}}$"
    return out


def clean_error(exc: BaseException) -> str:
    """An xgrammar error as a one-line message for the client."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = _CPP_PREFIX.sub("", text)
    return text.replace("Check failed: (error.empty()) is false: ", "")


def json_schema_grammar(schema: dict):
    """The `xgrammar.Grammar` of JSON text matching `schema`, as blockspec generates JSON: no free
    whitespace (`", "`, `": "`), no properties beyond the schema's, bounded strings rewritten
    (`bounded_strings_as_patterns`). Raises xgrammar's errors for a schema it cannot build."""
    import xgrammar as xgr
    return xgr.Grammar.from_json_schema(json.dumps(bounded_strings_as_patterns(schema)), any_whitespace=False,
                                        strict_mode=True)


@dataclass(frozen=True)
class StructuredOutput:
    """kind: "json" (value: a JSON-schema dict; {"type": "object"} for any object), "regex"
    (str), "grammar" (EBNF in xgrammar's GBNF dialect, root rule `root`), "choice" (non-empty
    list of str: the output is exactly one of them), "structural_tag" (an xgrammar structural
    tag as a dict, e.g. tool calls). `field` names the request field errors point at."""

    kind: str
    value: Any
    field: str = "structured_output"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.field}: unknown kind {self.kind!r} (one of {', '.join(KINDS)})")
        check = {"json": (dict,), "regex": (str,), "grammar": (str,), "choice": (list, tuple),
                 "structural_tag": (dict,)}[self.kind]
        if not isinstance(self.value, check):
            raise ValueError(f"{self.field}: a {self.kind} must be a {check[0].__name__}, "
                             f"got {type(self.value).__name__}")
        if self.kind == "choice" and (not self.value or not all(isinstance(c, str) and c for c in self.value)):
            raise ValueError(f"{self.field}: choice must be a non-empty list of non-empty strings")
        if self.kind in ("regex", "grammar") and not self.value:
            raise ValueError(f"{self.field}: the {self.kind} must not be empty")
        self.grammar()  # a spec that cannot be built is refused now, not in the engine

    def grammar(self):
        """The tokenizer-free `xgrammar.Grammar`; ValueError naming the field if it is invalid."""
        import xgrammar as xgr
        try:
            if self.kind == "json":
                return json_schema_grammar(self.value)
            if self.kind == "regex":
                return xgr.Grammar.from_regex(self.value)
            if self.kind == "grammar":
                return xgr.Grammar.from_ebnf(self.value)
            if self.kind == "choice":
                return xgr.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in self.value))
            return xgr.Grammar.from_structural_tag(self.value)
        except (RuntimeError, ValueError, TypeError) as e:
            what = {"json": "JSON schema", "regex": "regex", "grammar": "EBNF grammar", "choice": "choice",
                    "structural_tag": "structural tag"}[self.kind]
            raise ValueError(f"{self.field}: invalid {what}: {clean_error(e)}") from None
        except Exception as e:  # pydantic's ValidationError for a malformed structural tag
            raise ValueError(f"{self.field}: invalid {self.kind}: {clean_error(e)}") from None

    def key(self) -> str:
        """A stable text key (compiled grammars are cached by it)."""
        return self.kind + ":" + json.dumps(self.value, sort_keys=True)
