"""PNG plots of a `bench serve` sweep (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402


def _by_temperature(records: list[dict]) -> dict[float, list[dict]]:
    groups: dict[float, list[dict]] = {}
    for r in records:
        groups.setdefault(r["temperature"], []).append(r)
    return {t: sorted(rs, key=lambda r: r["concurrency"]) for t, rs in sorted(groups.items())}


def _line_plot(records: list[dict], value, ylabel: str, title: str, path: Path) -> None:
    """One line per temperature of value(record) against concurrency (log2 axis)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for temperature, rs in _by_temperature(records).items():
        points = [(r["concurrency"], value(r)) for r in rs if value(r) is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", label=f"T={temperature:g}")
    ax.set_xscale("log", base=2)
    concurrencies = sorted({r["concurrency"] for r in records})
    ax.set_xticks(concurrencies, labels=[str(c) for c in concurrencies])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_throughput(records: list[dict], path: Path) -> None:
    _line_plot(records, lambda r: r["output_tok_s"], "output tokens / s", "Throughput", path)


def plot_tpot(records: list[dict], path: Path) -> None:
    _line_plot(records, lambda r: r["tpot_ms"]["mean"], "mean TPOT (ms)", "Time per output token", path)


def plot_accept_histogram(records: list[dict], path: Path) -> bool:
    """Histogram of per-request accept lengths, one series per temperature; False (no file)
    when no response reported any verify step."""
    series = {t: [a for r in rs for a in r["request_accept_lengths"]] for t, rs in _by_temperature(records).items()}
    series = {t: v for t, v in series.items() if v}
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.hist(list(series.values()), bins=20, label=[f"T={t:g}" for t in series])
    ax.set_xlabel("accept length (committed tokens per verify step)")
    ax.set_ylabel("requests")
    ax.set_title("Per-request accept length")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_serve_plots(records: list[dict], out_dir: Path) -> dict[str, str]:
    """Write the sweep's plots into `out_dir`; returns {plot name: file name} of those written."""
    written = {"throughput": "throughput_vs_concurrency.png", "tpot": "tpot_vs_concurrency.png"}
    plot_throughput(records, out_dir / written["throughput"])
    plot_tpot(records, out_dir / written["tpot"])
    if plot_accept_histogram(records, out_dir / "accept_length_hist.png"):
        written["accept_length"] = "accept_length_hist.png"
    return written
