"""Pack a trained target + drafter for the package: bf16 safetensors, each file ≤ 15 MiB.

python bench/export_bundle.py TARGET_DIR DRAFTER_DIR OUT_DIR → OUT_DIR/{target,drafter}/… plus
the training logs and loss curves as flat files (the device tool returns files ≤ 2 folders deep).
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

MAX_SHARD = 15 * 1024 * 1024


def export_weights(src: Path, dst: Path) -> None:
    """Rewrite the safetensors of `src` as bf16 shards of at most MAX_SHARD bytes."""
    state = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update(load_file(str(f)))
    shards, current, size = [], {}, 0
    for name, t in state.items():
        t = t.to(torch.bfloat16).contiguous()
        n = t.numel() * 2
        if current and size + n > MAX_SHARD:
            shards.append(current)
            current, size = {}, 0
        current[name] = t
        size += n
    shards.append(current)
    if len(shards) == 1:
        save_file(shards[0], str(dst / "model.safetensors"))
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(dst / fname))
        weight_map.update({k: fname for k in shard})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))


def export_dir(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if (f.is_file() and f.suffix in (".json", ".jinja") and not f.name.startswith("model.safetensors")
                and f.name != "snapshots.json"):
            shutil.copy(f, dst / f.name)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    cfg.pop("dtype", None)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    export_weights(src, dst)


def main(target: str, drafter: str, out: str) -> None:
    out_dir = Path(out)
    export_dir(Path(target), out_dir / "target")
    export_dir(Path(drafter), out_dir / "drafter")
    for name, src in (("target", Path(target)), ("drafter", Path(drafter))):
        for f in ("train_log.jsonl", "loss_curve.png"):
            if (src / f).is_file():
                shutil.copy(src / f, out_dir / f"{name}_{f}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
