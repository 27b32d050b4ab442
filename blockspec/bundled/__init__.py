"""The bundled default target + drafter pair (trained here; see issue "bundled default model")."""

from __future__ import annotations

from pathlib import Path

BUNDLED_DIR = Path(__file__).parent
TARGET_DIR = BUNDLED_DIR / "target"
DRAFTER_DIR = BUNDLED_DIR / "drafter"


def default_model(draft_model: str | None = None, spec: str | None = None) -> tuple[str, str | None, str]:
    """(target dir, drafter dir, spec) of the bundled pair; a clear error until it ships."""
    if not (TARGET_DIR / "config.json").is_file():
        raise FileNotFoundError(
            "no --model given and no bundled default model is installed yet; pass --model DIR")
    has_drafter = (DRAFTER_DIR / "config.json").is_file()
    if spec is None:
        spec = "dflash" if has_drafter else "none"
    if draft_model is None and spec in ("dflash", "ddtree") and has_drafter:
        draft_model = str(DRAFTER_DIR)
    return str(TARGET_DIR), draft_model, spec
