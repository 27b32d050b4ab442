"""bench/tree_vs_chain.py: the sampled-trees verdict from `bench offline` JSONs."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "tree_vs_chain.py"
spec = importlib.util.spec_from_file_location("tree_vs_chain", SCRIPT)
tree_vs_chain = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tree_vs_chain)


def write(directory: Path, name: str, sampled_trees: bool, cells: dict) -> None:
    """A `bench offline` JSON: cells (temperature, batch) → spec tok/s."""
    records = [{"temperature": t, "batch_size": b, "spec": {"tok_s": tok_s}, "speedup": tok_s / 100.0,
                "accept_length": 2.0} for (t, b), tok_s in cells.items()]
    for (t, b), tok_s in cells.items():
        doc = {"spec": "dflash", "engine_options": {"sampled_trees": sampled_trees}, "records": [r for r in records
               if (r["temperature"], r["batch_size"]) == (t, b)]}
        (directory / f"{name}_{t}_{b}.json").write_text(json.dumps(doc))


def test_trees_pay_only_when_they_win_on_average_and_lose_nowhere_beyond_noise(tmp_path, capsys):
    chain = {(0.0, 1): 300.0, (0.6, 1): 150.0, (1.0, 16): 200.0}
    write(tmp_path, "chain", False, chain)
    write(tmp_path, "trees", True, {(0.0, 1): 297.0, (0.6, 1): 160.0, (1.0, 16): 198.0})
    table = tree_vs_chain.cells(tmp_path)
    assert set(table[(0.6, 1)]) == {"dflash", "dflash --sampled-trees"}
    assert tree_vs_chain.verdict(table, 0.05)[0]                   # T > 0 mean 1.028; T = 0 within 5 %
    write(tmp_path, "trees", True, {(0.0, 1): 297.0, (0.6, 1): 156.0, (1.0, 16): 192.0})
    assert not tree_vs_chain.verdict(tree_vs_chain.cells(tmp_path), 0.05)[0]    # cells ≥ 0.96, mean 0.999
    write(tmp_path, "trees", True, {(0.0, 1): 270.0, (0.6, 1): 170.0, (1.0, 16): 210.0})
    assert not tree_vs_chain.verdict(tree_vs_chain.cells(tmp_path), 0.05)[0]    # T = 0 lost 10 %
    (tmp_path / "trees_1.0_16.json").unlink()
    ok, notes = tree_vs_chain.verdict(tree_vs_chain.cells(tmp_path), 0.05)
    assert not ok and any("missing" in n for n in notes)
