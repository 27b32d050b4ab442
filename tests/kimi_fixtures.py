"""A tiny Kimi-style tokenizer directory: tiktoken.model + tokenizer_config.json (+ template).

The ranks are the 256 bytes, then merges (" the", "中文", "123", and merges the pre-tokenisation
pattern must never let BPE reach: "中a" across a Han/Latin boundary, "1234" past three digits).
The 258 special ids follow the ranks, as in Kimi's checkpoints; tokenizer_config.json names a few
of them and points at remote code (tokenization_kimi.py) that blockspec must never need.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

MERGES = [b"th", b"the", b" the", "中".encode()[:2], "中".encode(), "文".encode()[:2], "文".encode(),
          "中文".encode(), "中a".encode(), b"12", b"123", b"1234", b"ll", b"'ll"]
BASE = 256 + len(MERGES)
SPECIALS = {BASE: "[BOS]", BASE + 1: "[EOS]", BASE + 2: "<|im_end|>", BASE + 3: "<|im_user|>",
            BASE + 4: "<|im_assistant|>", BASE + 5: "<|im_system|>", BASE + 6: "<|im_middle|>"}
THINK = BASE + 7   # marked "special": false: kept when decoding with skip_special_tokens
# Kimi K2's tool-call markers (special tokens, as in its vocabulary), after THINK.
TOOL_MARKERS = {BASE + 8: "<|tool_calls_section_begin|>", BASE + 9: "<|tool_calls_section_end|>",
                BASE + 10: "<|tool_call_begin|>", BASE + 11: "<|tool_call_argument_begin|>",
                BASE + 12: "<|tool_call_end|>"}
TEMPLATE = (
    "{{ bos_token }}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}<|im_system|>system"
    "{%- elif m['role'] == 'user' -%}<|im_user|>user"
    "{%- else -%}<|im_assistant|>assistant{%- endif -%}"
    "<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if tools -%}<|im_system|>tools<|im_middle|>{{ tools | tojson }}<|im_end|>{%- endif -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "中文 the café 😀", "name": None}]
TEXT = "The 中文 theatre, 12345 cafés — we'll see 😀🎉 北京\n\n  end  "


def write_kimi_tokenizer(out: Path, template: str | None = TEMPLATE, template_file: bool = False,
                         tool_markers: bool = True) -> Path:
    """The tokenizer files in `out`; `tool_markers=False` leaves the tool-call markers' ids reserved."""
    out.mkdir(parents=True, exist_ok=True)
    ranks = [bytes([b]) for b in range(256)] + MERGES
    (out / "tiktoken.model").write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    decoder = {str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                        "single_word": False}
               for i, t in {**SPECIALS, **(TOOL_MARKERS if tool_markers else {})}.items()}
    decoder[str(THINK)] = {"content": "<think>", "special": False}
    config = {"tokenizer_class": "TikTokenTokenizer", "bos_token": "[BOS]", "eos_token": "[EOS]",
              "pad_token": None, "added_tokens_decoder": decoder,
              "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}
    if template and not template_file:
        config["chat_template"] = template
    elif template:
        (out / "chat_template.jinja").write_text(template)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": BASE + 2}))
    return out
