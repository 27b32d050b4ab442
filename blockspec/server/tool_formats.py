"""Which tool-call format a model writes, decided in this one place from its tokenizer: Kimi K2's
when the vocabulary has Kimi's tool-call markers as special tokens, Hermes (`<tool_call>` JSON,
the Qwen templates') otherwise."""

from __future__ import annotations

from blockspec.server.hermes_tool_calls import HermesToolFormat
from blockspec.server.kimi_tool_calls import MARKERS, KimiToolFormat
from blockspec.server.tool_calls import ToolFormat


def tool_format_for(tokenizer) -> ToolFormat:
    """The format of a blockspec `Tokenizer`'s model. A vocabulary with only some of Kimi's
    markers is refused (ValueError): neither format would parse its replies right."""
    specials = tokenizer.special_token_ids
    present = [m for m in MARKERS if m in specials]
    if not present:
        return HermesToolFormat()
    if len(present) < len(MARKERS):
        missing = ", ".join(m for m in MARKERS if m not in specials)
        raise ValueError(f"the tokenizer in {tokenizer.source!r} has some of Kimi's tool-call special tokens "
                         f"but not {missing}: its tool-call format is unknown")
    return KimiToolFormat({m: specials[m] for m in MARKERS})
