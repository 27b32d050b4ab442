"""Builders of tiny Hugging Face checkpoints (tokenizer + random model) for tests.

A plain module, imported as `from fixtures import ...`; `tests/conftest.py` calls the builders
once per session. Everything is built offline and fast: a byte-level BPE trained in
milliseconds on the corpus below, or a WordLevel tokenizer over a few words for tiny
vocabularies, and models of a few hundred kilobytes made with transformers' own classes.

Token id layout (both tokenizer kinds): ordinary tokens first, then, if the trained vocabulary
came out short, `<|reserved_N|>` fillers, then the four special tokens, `<|MASK|>` last, so that
the tokenizer has exactly `vocab_size` tokens and `<|MASK|>` is id `vocab_size - 1`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK_TOKEN = "<|MASK|>"
SPECIAL_TOKENS = (EOS_TOKEN, IM_START, IM_END, MASK_TOKEN)
UNK_TOKEN = "<unk>"

# Smallest vocabulary a byte-level BPE can have: 256 bytes + the special tokens.
MIN_BPE_VOCAB = 300

# ChatML-like: an optional default system turn is not added; `enable_thinking=False` appends an
# empty think block after the generation prompt, so template kwargs can be seen to pass through.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking -%}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)

# Training text for the BPE, written for this project. The non-English lines make the BPE
# learn partial merges inside multi-byte characters, which detokenization tests rely on.
CORPUS = """\
The lighthouse keeper climbed the stairs every evening at dusk. There were one hundred and
twelve steps, and he counted each of them, because counting kept his mind quiet. At the top
he cleaned the glass, trimmed the wick, and watched the ships pass along the dark coast.

In the spring the village held a market by the harbour. Farmers brought cheese, honey, apples
and bread; fishermen sold what the night had given them. Children ran between the stalls while
their parents argued about prices, the weather, and whether the new road would ever be built.

A small program reads a file, splits every line into words, and counts how often each word
appears. The result is printed as a table, sorted from the most common word to the rarest one.
Writing such a program is a good first exercise, since it touches input, output, strings, lists
and dictionaries in only a few lines of code.

Mathematics begins with counting: one, two, three, four, five, six, seven, eight, nine, ten.
If a train leaves at 9:45 and arrives at 11:20, the journey takes one hour and thirty-five
minutes. The sum of the first ten numbers is 55, and their product is 3628800.

Un café crème, s'il vous plaît. The naïve traveller ordered crème brûlée in a café near the
façade of the old théâtre, then took the train from Zürich to São Paulo — or so his résumé said.
Déjà vu: the price was 4,50 € and the temperature 21 °C.

東京は日本の首都です。北京是中国的首都。今日はいい天気ですね。我们明天去公园散步。
Москва — столица России. Ελλάδα είναι μια όμορφη χώρα. 🙂 👍 🚀
"""

# Words of the WordLevel tokenizer used for tiny vocabularies (statistical tests).
WORDS = (
    "the a and of to in is it you that he was for on are with as I his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number"
).split()

SMALL_MODEL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6)


# ---- tokenizer ---------------------------------------------------------------------------------

def _filler_tokens(count: int) -> list[str]:
    """Reserved special tokens that pad a short vocabulary up to the model's size."""
    return [f"<|reserved_{i}|>" for i in range(count)]


def _pad_and_add_specials(tok, vocab_size: int):
    """Append fillers then the special tokens so that the vocabulary is exactly vocab_size."""
    missing = vocab_size - len(SPECIAL_TOKENS) - tok.get_vocab_size()
    tok.add_special_tokens(_filler_tokens(missing) + list(SPECIAL_TOKENS))
    assert tok.get_vocab_size() == vocab_size, (tok.get_vocab_size(), vocab_size)
    return tok


@functools.lru_cache(maxsize=None)
def _tokenizer_json(vocab_size: int) -> str:
    """tokenizer.json text for `vocab_size` (cached: several fixtures share a size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size >= MIN_BPE_VOCAB:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIAL_TOKENS), show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(CORPUS.splitlines(), trainer)
    else:
        n_words = min(len(WORDS), vocab_size - len(SPECIAL_TOKENS) - 1)
        if n_words < 1:
            raise ValueError(f"vocab_size {vocab_size} is too small (need at least {len(SPECIAL_TOKENS) + 2})")
        vocab = {word: i for i, word in enumerate(WORDS[:n_words])}
        vocab[UNK_TOKEN] = n_words
        tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return _pad_and_add_specials(tok, vocab_size).to_str()


def write_tokenizer(dir, vocab_size: int, chat_template: bool = True, template_file: bool = False) -> None:
    """Write tokenizer.json and tokenizer_config.json (and maybe chat_template.jinja) into `dir`.

    vocab_size >= 300: byte-level BPE trained on CORPUS; smaller: WordLevel over WORDS. The
    tokenizer has exactly vocab_size tokens. The chat template goes into tokenizer_config.json,
    or into chat_template.jinja with template_file=True.
    """
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(_tokenizer_json(vocab_size))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "clean_up_tokenization_spaces": False,
        "model_max_length": SMALL_MODEL["max_position_embeddings"],
    }
    if vocab_size < MIN_BPE_VOCAB:
        config["unk_token"] = UNK_TOKEN
    if chat_template and not template_file:
        config["chat_template"] = CHAT_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    if chat_template and template_file:
        (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def special_token_ids(vocab_size: int) -> dict[str, int]:
    """Ids of the special tokens in a tokenizer written by write_tokenizer(vocab_size)."""
    first = vocab_size - len(SPECIAL_TOKENS)
    return {token: first + i for i, token in enumerate(SPECIAL_TOKENS)}


# ---- models ------------------------------------------------------------------------------------

def _randomize_weights(model, std: float, embed_std: float, norm_std: float, seed: int) -> None:
    """Re-draw every weight: N(0, std) for linears/biases, N(0, embed_std) for embeddings and the
    LM head, 1 + N(0, norm_std) for RMSNorm weights, so that norm or bias bugs change the logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied weights are listed once
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                param.copy_(1 + norm_std * noise)
            elif "embed_tokens" in name or "lm_head" in name:
                param.copy_(embed_std * noise)
            else:
                param.copy_(std * noise)


def to_old_rope_convention(config: dict) -> dict:
    """Rewrite transformers 5's `rope_parameters` as the older top-level `rope_theta` and
    `rope_scaling` (null for plain RoPE), as pre-5 checkpoints store them."""
    config = dict(config)
    params = dict(config.pop("rope_parameters", None) or {})
    config["rope_theta"] = params.pop("rope_theta", 10000.0)
    config["rope_scaling"] = params if params.get("rope_type", "default") != "default" else None
    return config


def _write_generation_config(out: Path, vocab_size: int) -> None:
    """generation_config.json with both end tokens as EOS (config.json has only <|endoftext|>)."""
    ids = special_token_ids(vocab_size)
    gen = {"eos_token_id": [ids[IM_END], ids[EOS_TOKEN]], "pad_token_id": ids[EOS_TOKEN],
           "bos_token_id": None, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))


def _save_model(out: Path, model, sharded: bool) -> None:
    """save_pretrained as float32 safetensors; sharded=True forces at least two shards."""
    model = model.to(torch.float32)
    total_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # Shards hold whole tensors; a third of the model per shard gives two shards or more.
    shard_size = max(total_bytes // 3, 1) if sharded else 10 * total_bytes + (1 << 20)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=shard_size)


def _write_model(dir, config_cls, model_cls, *, vocab_size: int, sharded: bool, num_layers: int,
                 rope_convention: str, seed: int, std: float, embed_std: float, norm_std: float,
                 chat_template_file: bool = False, customize=None, **config_kwargs) -> Path:
    """Build, randomize and save one tiny model with its tokenizer; return the directory.
    `customize(model)` may then change weights the randomization leaves alone (buffers)."""
    if rope_convention not in ("new", "old"):
        raise ValueError(f"rope_convention must be 'new' or 'old', not {rope_convention!r}")
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = special_token_ids(vocab_size)
    config = config_cls(vocab_size=vocab_size, num_hidden_layers=num_layers, eos_token_id=ids[EOS_TOKEN],
                        bos_token_id=None, pad_token_id=None, **config_kwargs)
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
        torch.manual_seed(seed)
        model = model_cls(config).eval()
    _randomize_weights(model, std=std, embed_std=embed_std, norm_std=norm_std, seed=seed)
    if customize is not None:
        customize(model)
    _save_model(out, model, sharded)
    if rope_convention == "old":
        path = out / "config.json"
        path.write_text(json.dumps(to_old_rope_convention(json.loads(path.read_text())), indent=2))
    _write_generation_config(out, vocab_size)
    write_tokenizer(out, vocab_size, template_file=chat_template_file)
    return out


def write_llama(dir, *, vocab_size: int = 512, sharded: bool = False, num_layers: int = 2,
                rope_convention: str = "old", seed: int = 0, **config_overrides) -> Path:
    """A tiny Llama with llama3 RoPE scaling; by default its config.json uses the old
    top-level rope_theta/rope_scaling convention (as Llama 3.x checkpoints do)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    kwargs = {**SMALL_MODEL, "rope_parameters": rope, "tie_word_embeddings": False, **config_overrides}
    return _write_model(dir, LlamaConfig, LlamaForCausalLM, vocab_size=vocab_size, sharded=sharded,
                        num_layers=num_layers, rope_convention=rope_convention, seed=seed,
                        std=0.08, embed_std=0.2, norm_std=0.1, **kwargs)


def write_qwen2(dir, *, vocab_size: int = 512, sharded: bool = False, num_layers: int = 2,
                rope_convention: str = "new", seed: int = 1, **config_overrides) -> Path:
    """A tiny Qwen2 (bias on q/k/v); config.json in the new rope_parameters convention; the
    chat template is written to chat_template.jinja."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    kwargs = {**SMALL_MODEL, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
              "tie_word_embeddings": False, "chat_template_file": True, **config_overrides}
    return _write_model(dir, Qwen2Config, Qwen2ForCausalLM, vocab_size=vocab_size, sharded=sharded,
                        num_layers=num_layers, rope_convention=rope_convention, seed=seed,
                        std=0.08, embed_std=0.2, norm_std=0.1, **kwargs)


def write_qwen3(dir, *, vocab_size: int = 512, sharded: bool = False, num_layers: int = 2,
                tie_word_embeddings: bool = True, rope_convention: str = "new", seed: int = 2,
                **config_overrides) -> Path:
    """A tiny Qwen3 (q/k RMSNorm), tied embeddings by default."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    kwargs = {**SMALL_MODEL, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
              "tie_word_embeddings": tie_word_embeddings, **config_overrides}
    return _write_model(dir, Qwen3Config, Qwen3ForCausalLM, vocab_size=vocab_size, sharded=sharded,
                        num_layers=num_layers, rope_convention=rope_convention, seed=seed,
                        std=0.08, embed_std=0.2, norm_std=0.1, **kwargs)


def write_tiny_vocab_qwen3(dir, vocab_size: int = 12, *, seed: int = 3) -> Path:
    """A Qwen3 over a 12-token WordLevel vocabulary (hidden 32, 2 layers) for statistical tests
    that enumerate the whole vocabulary. Embeddings are scaled so that next-token distributions
    are peaky but far from one-hot."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    kwargs = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return _write_model(dir, Qwen3Config, Qwen3ForCausalLM, vocab_size=vocab_size, sharded=False,
                        num_layers=2, rope_convention="new", seed=seed,
                        std=0.15, embed_std=0.25, norm_std=0.1, **kwargs)
