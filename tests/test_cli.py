"""`blockspec generate`: output, metrics, and exit code 2 with a message for bad arguments."""

import json

import pytest

from blockspec.cli import main


def test_generate_json(qwen3_dir, capsys):
    code = main(["generate", "--model", qwen3_dir, "--prompt", "hello world", "--max-tokens", "6",
                 "--temperature", "0", "--ignore-eos", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 6 and out["finish_reason"] == "length"
    assert out["spec_decoding"]["algorithm"] == "none"


def test_generate_speculative_prints_metrics(qwen3_dir, capsys):
    code = main(["generate", "--model", qwen3_dir, "--prompt", "a b a b a b a b", "--max-tokens", "12",
                 "--temperature", "0", "--spec", "ngram", "--block-size", "4", "--ignore-eos"])
    assert code == 0
    err = capsys.readouterr().err
    assert "accept_length=" in err and "verify_steps=" in err


@pytest.mark.parametrize("argv, needle", [
    (["--top-p", "0"], "top_p"),
    (["--temperature", "-1"], "temperature"),
    (["--max-tokens", "0"], "max_tokens"),
    (["--top-k", "-5"], "top_k"),
    (["--min-p", "2"], "min_p"),
    (["--dtype", "float8"], "dtype"),
    (["--device", "tpu"], "device"),
    (["--spec", "dflash"], "draft"),
    (["--spec", "ngram", "--block-size", "1"], "block_size"),
])
def test_bad_arguments_exit_2(qwen3_dir, capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["generate", "--model", qwen3_dir, "--prompt", "hi", *argv]))
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_missing_model_dir_exits_2(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path / "nope"), "--prompt", "hi"]) == 2
    assert "config.json" in capsys.readouterr().err


def test_cli_parser_builds_without_the_web_stack():
    """`blockspec bench step` / `generate` start where fastapi and uvicorn are absent (a bare GPU
    machine): building the parser must not import them."""
    import subprocess
    import sys
    code = ("import sys\n"
            "for name in ('fastapi', 'starlette', 'uvicorn', 'pydantic'):\n"
            "    sys.modules[name] = None\n"
            "from blockspec.cli import build_parser\n"
            "args = build_parser().parse_args(['bench', 'step', '--device', 'cpu'])\n"
            "assert args.shape == 'qwen3-8b'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
