"""One set of engine flags for every command: generate, serve, bench offline and check lossless
expose the same flags (same types, choices, defaults) and build their EngineConfig the same way."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from blockspec.cli import build_parser
from blockspec.engine_args import ENGINE_GROUP_TITLE, NOT_FLAGS, engine_config_from_args, engine_settings_from_args
from blockspec.engine.config import EngineConfig

COMMANDS = (("generate",), ("serve",), ("bench", "offline"), ("check", "lossless"))
# what legitimately differs between commands: parameters of add_engine_arguments
PER_COMMAND = {
    ("generate",): {"model_required": False, "spec": None, "max_running_requests": None},
    ("serve",): {"model_required": False, "spec": None, "max_running_requests": None},
    ("bench", "offline"): {"model_required": True, "spec": "dflash", "max_running_requests": None},
    ("check", "lossless"): {"model_required": True, "spec": "dflash", "max_running_requests": 1024},
}
# every engine flag with a value that differs from EngineConfig's default, and the field it sets
EVERY_FLAG = {
    "--model": ("m", "model", "m"),
    "--dtype": ("bfloat16", "dtype", "bfloat16"),
    "--device": ("cuda", "device", "cuda"),
    "--draft-model": ("d", "draft_model", "d"),
    "--spec": ("ddtree", "spec", "ddtree"),
    "--block-size": ("8", "block_size", 8),
    "--budget": ("32", "tree_budget", 32),
    "--topk": ("4", "tree_topk", 4),
    "--spec-verify": ("rejection", "spec_verify", "rejection"),
    "--sampled-trees": (None, "sampled_trees", True),
    "--draft-block": ("full", "draft_block", "full"),
    "--spec-policy": ("static", "spec_policy", "static"),
    "--max-running-requests": ("8", "max_running_requests", 8),
    "--kv-cache-tokens": ("4096", "kv_cache_tokens", 4096),
    "--page-size": ("32", "page_size", 32),
    "--max-model-len": ("512", "max_model_len", 512),
    "--max-prefill-tokens": ("256", "max_prefill_tokens", 256),
    "--engine-seed": ("7", "seed", 7),
    "--attention-backend": ("triton", "attention_backend", "triton"),
    "--disable-cuda-graph": (None, "cuda_graph", False),
    "--disable-fused-ops": (None, "fused_ops", False),
    "--disable-overlap-schedule": (None, "overlap_schedule", False),
    "--batch-invariant": (None, "batch_invariant", True),
    "--cuda-graph-max-bs": ("16", "cuda_graph_max_bs", 16),
    "--tensor-parallel-size": ("2", "tensor_parallel_size", 2),
    "--expert-parallel": (None, "expert_parallel", True),
}


def subparser(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[name]
    return parser


def engine_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    (group,) = [g for g in parser._action_groups if g.title == ENGINE_GROUP_TITLE]
    return {a.option_strings[0]: a for a in group._group_actions}


def describe(action: argparse.Action) -> dict:
    return {"option_strings": action.option_strings, "dest": action.dest, "default": action.default,
            "choices": tuple(action.choices) if action.choices else None, "type": action.type,
            "nargs": action.nargs, "required": action.required, "const": action.const}


def every_flag_argv() -> list[str]:
    argv = []
    for flag, (value, _, _) in EVERY_FLAG.items():
        argv += [flag] if value is None else [flag, value]
    return argv


def test_every_command_has_the_same_engine_flags():
    described = {cmd: {flag: describe(a) for flag, a in engine_actions(subparser(*cmd)).items()}
                 for cmd in COMMANDS}
    reference = described[("generate",)]
    assert list(reference) == list(EVERY_FLAG)
    for cmd, flags in described.items():
        expected = PER_COMMAND[cmd]
        assert list(flags) == list(reference), cmd
        assert flags["--model"]["required"] is expected["model_required"], cmd
        assert flags["--spec"]["default"] == expected["spec"], cmd
        assert flags["--max-running-requests"]["default"] == expected["max_running_requests"], cmd
        for flag, d in flags.items():
            want = dict(reference[flag])
            if flag == "--model":
                want["required"] = d["required"]
            elif flag == "--spec":
                want["default"] = d["default"]
            elif flag == "--max-running-requests":
                want["default"] = d["default"]
            assert d == want, (cmd, flag)


def test_choices_come_from_the_engine_config():
    from blockspec.engine.config import ATTENTION_BACKENDS, SPEC_ALGORITHMS, SPEC_POLICIES, SPEC_VERIFY_RULES
    actions = engine_actions(subparser("serve"))
    assert tuple(actions["--spec-policy"].choices) == SPEC_POLICIES == ("static", "adaptive")
    assert actions["--spec-policy"].default == "adaptive"
    assert tuple(actions["--spec"].choices) == SPEC_ALGORITHMS
    assert tuple(actions["--spec-verify"].choices) == SPEC_VERIFY_RULES
    assert tuple(actions["--attention-backend"].choices) == ATTENTION_BACKENDS


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_engine_config_field_is_reachable_from_the_flags(cmd):
    required = {"generate": ["--prompt", "p"]}.get(cmd[0], [])
    args = subparser(*cmd).parse_args(every_flag_argv() + required)
    settings = engine_settings_from_args(args)
    for flag, (_, name, value) in EVERY_FLAG.items():
        assert settings[name] == value, flag
        assert value != EngineConfig(model="x").__dict__[name] or name == "model", flag
    reachable = {name for _, name, _ in EVERY_FLAG.values()}
    assert reachable | set(NOT_FLAGS) == {f.name for f in dataclasses.fields(EngineConfig)}
    assert not reachable & set(NOT_FLAGS)


def test_serve_spec_verify_reaches_the_engine_config():
    args = subparser("serve").parse_args(["--model", "m", "--spec", "dflash", "--draft-model", "d",
                                          "--spec-verify", "rejection"])
    config = engine_config_from_args(args)
    assert isinstance(config, EngineConfig)
    assert (config.model, config.spec, config.draft_model, config.spec_verify) == ("m", "dflash", "d", "rejection")


def test_every_flag_lands_in_the_engine_config():
    args = subparser("serve").parse_args(every_flag_argv())
    config = engine_config_from_args(args)
    for flag, (_, name, value) in EVERY_FLAG.items():
        assert getattr(config, name) == value, flag


def test_flags_left_out_give_the_engine_config_defaults():
    args = subparser("serve").parse_args(["--model", "m"])
    assert engine_config_from_args(args) == EngineConfig(model="m")


def test_generate_keeps_its_sampling_seed_apart_from_the_engine_seed():
    args = subparser("generate").parse_args(["--model", "m", "--prompt", "p", "--seed", "3", "--engine-seed", "5"])
    assert args.seed == 3 and engine_config_from_args(args).seed == 5


def test_check_lossless_old_verify_flag_still_works():
    parser = subparser("check", "lossless")
    assert parser.parse_args(["--model", "m", "--verify", "rejection"]).spec_verify == "rejection"
    assert parser.parse_args(["--model", "m"]).spec_verify == "auto"


@pytest.mark.parametrize("cmd", COMMANDS)
@pytest.mark.parametrize("argv", [["--page-size", "0"], ["--attention-backend", "cuda"], ["--spec-verify", "maybe"],
                                  ["--cuda-graph-max-bs", "-1"], ["--budget", "0"], ["--spec-policy", "fastest"]])
def test_bad_engine_flags_exit_2(cmd, argv, capsys):
    with pytest.raises(SystemExit) as info:
        subparser(*cmd).parse_args(["--model", "m", *argv])
    assert info.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_bench_tools_get_the_other_engine_settings():
    from blockspec.bench import SpecEngineArgs
    args = subparser("bench", "offline").parse_args(["--model", "m", "--draft-model", "d", "--budget", "8",
                                                     "--page-size", "32", "--spec-verify", "rejection"])
    spec_args = SpecEngineArgs(**SpecEngineArgs.engine_kwargs(engine_settings_from_args(args)))
    assert (spec_args.model, spec_args.draft_model, spec_args.spec, spec_args.budget) == ("m", "d", "dflash", 8)
    spec = spec_args.spec_config(page_size=4, max_running_requests=3)
    assert (spec.page_size, spec.max_running_requests, spec.spec_verify, spec.tree_budget) == (32, 3, "rejection", 8)
    plain = spec_args.plain_config()
    assert (plain.spec, plain.draft_model, plain.tree_budget, plain.spec_verify, plain.page_size) == \
        ("none", None, None, "auto", 32)


def test_batch_invariant_config_refuses_what_it_cannot_honour(monkeypatch):
    from blockspec.engine.config import EngineConfig
    with pytest.raises(ValueError, match="batch_invariant needs attention_backend"):
        EngineConfig(model="x", batch_invariant=True, attention_backend="reference").validate()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="batch_invariant needs a CUDA device"):
        EngineConfig(model="x", device="cpu", batch_invariant=True).validate()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="batch_invariant under Triton's interpreter needs float32"):
        EngineConfig(model="x", device="cpu", dtype="bfloat16", batch_invariant=True).validate()
    EngineConfig(model="x", device="cpu", batch_invariant=True).validate()
