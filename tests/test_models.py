"""Our Llama / Qwen2 / Qwen3 forward against transformers (the reference)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from blockspec import LLM, SamplingParams
from blockspec.attention.metadata import AttentionBatch, causal_new_mask
from blockspec.kv.allocator import PageAllocator, PageTable
from blockspec.kv.cache import KVCache
from blockspec.models.loader import load_target

FAMILIES = ["llama_dir", "qwen2_dir", "qwen3_dir", "qwen3_sharded_dir"]


def our_forward(model, ids: torch.Tensor, dtype=torch.float32, capture_layers=()):
    cfg = model.config
    B, T = ids.shape
    alloc = PageAllocator(64, 8)
    cache = KVCache(cfg.num_layers, 64, 8, cfg.num_kv_heads, cfg.head_dim, dtype, "cpu")
    tables = [PageTable(8) for _ in range(B)]
    for t in tables:
        t.reserve(alloc, T)
    batch = AttentionBatch(
        slots=torch.tensor([[t.slot(p) for p in range(T)] for t in tables]),
        page_table=torch.tensor([t.pages for t in tables]),
        prefix_lens=torch.zeros(B, dtype=torch.long), new_lens=torch.full((B,), T),
        new_mask=causal_new_mask(B, T, "cpu"))
    hidden, features = model(ids, torch.arange(T).expand(B, T), cache, batch, capture_layers)
    return model.logits(hidden), features


def our_logits(model, ids: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return our_forward(model, ids, dtype)[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(family, request):
    model_dir = request.getfixturevalue(family)
    ref_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ours = load_target(model_dir, "float32", "cpu")
    ids = torch.randint(0, ours.config.vocab_size, (2, 37), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = ref_model(ids).logits
    out = our_logits(ours, ids)
    rel = (out - ref).abs().max() / ref.abs().max()
    assert rel < 1e-4, f"relative error {rel:.2e}"


@pytest.mark.parametrize("family", ["llama_dir", "qwen3_dir"])
def test_captured_features_are_transformers_hidden_states(family, request):
    """Every layer's captured output (the drafter's target features; each taken from the next
    layer's input stream, the last the final-normed state) is transformers' hidden_states[i + 1]."""
    model_dir = request.getfixturevalue(family)
    ref_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ours = load_target(model_dir, "float32", "cpu")
    ids = torch.randint(0, ours.config.vocab_size, (2, 19), generator=torch.Generator().manual_seed(3))
    layers = tuple(range(ours.config.num_layers))
    with torch.no_grad():
        ref = ref_model(ids, output_hidden_states=True).hidden_states
    _, features = our_forward(ours, ids, capture_layers=layers[::-1])
    H = ours.config.hidden_size
    for k, i in enumerate(layers[::-1]):                       # in the order asked, any order
        want = ref[i + 1]
        assert (features[..., k * H:(k + 1) * H] - want).abs().max() < 1e-4 * want.abs().max(), f"layer {i}"


def hf_greedy(model_dir, prompt_ids, n):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    for p in prompt_ids:
        with torch.no_grad():
            seq = model.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        outs.append(seq[0, len(p):].tolist())
    return outs


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_matches_transformers(family, request):
    model_dir = request.getfixturevalue(family)
    gen = torch.Generator().manual_seed(1)
    llm = LLM(model=model_dir, dtype="float32", device="cpu")
    vocab = llm.engine.model_config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (5, 17, 9)]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    expected = hf_greedy(model_dir, prompts, 64)
    single = llm.generate(prompts[0], params)[0]
    assert single.token_ids == expected[0]
    assert single.finish_reason == "length"
    batched = llm.generate(prompts, params)
    for out, exp in zip(batched, expected):
        assert out.token_ids == exp
    assert llm.engine.allocator.num_used_pages == 0


def test_dtype_and_device_errors(qwen3_dir):
    with pytest.raises(ValueError, match="dtype"):
        LLM(model=qwen3_dir, dtype="float8")
    with pytest.raises(ValueError, match="device"):
        LLM(model=qwen3_dir, device="tpu")


def test_bfloat16_runs_close_to_float32(qwen3_dir):
    ids = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(3))
    ref = our_logits(load_target(qwen3_dir, "float32"), ids)
    model = load_target(qwen3_dir, "bfloat16")
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    out = our_logits(model, ids, torch.bfloat16)
    assert (out - ref).abs().max() / ref.abs().max() < 5e-2
