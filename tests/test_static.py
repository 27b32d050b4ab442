"""Static checks over the source: a name used but never defined fails here, also on code paths
the CPU suite never runs (CUDA-only branches), where it would otherwise surface on a GPU."""

from __future__ import annotations

from pathlib import Path

from pyflakes import api, messages
from pyflakes.reporter import Reporter

ROOT = Path(__file__).resolve().parents[1]


class _Collect(Reporter):
    def __init__(self):
        self.found = []

    def flake(self, message):
        self.found.append(message)

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")

    def syntaxError(self, filename, msg, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: {msg}")


def undefined_names(paths) -> list[str]:
    reporter = _Collect()
    for path in paths:
        api.checkPath(str(path), reporter)
    bad = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)
    return [str(m) for m in reporter.found if not hasattr(m, "message_args") or isinstance(m, bad)]


def test_no_undefined_names_in_the_package_and_benchmarks():
    files = sorted((ROOT / "blockspec").rglob("*.py")) + sorted((ROOT / "bench").glob("*.py"))
    assert undefined_names(files) == []


def test_the_check_catches_an_undefined_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return _mean_factor(1, 2)\n")
    assert len(undefined_names([bad])) == 1
