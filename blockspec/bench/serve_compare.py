"""`blockspec bench serve --compare-static`: the serving sweep against several servers side by
side — one started with `--spec-policy adaptive`, one plain (`--spec none`) and any static
configurations (`--spec-policy static`, a block size or budget each) — and, per temperature,
adaptive ÷ best static and adaptive ÷ plain at each concurrency, with a plot of output tok/s
against concurrency (`bench/compare.py` does the same in one process for `bench offline`)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from blockspec.bench.compare import plot_compare, summarise
from blockspec.bench.serve import ServeBenchConfig, run_sweep


def parse_servers(text: str) -> dict[str, str]:
    """`NAME=URL,NAME=URL,…` → {name: url}; the names must include `adaptive` and `plain`."""
    servers: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise ValueError(f"--compare-static takes NAME=URL items, got {item!r}")
        if name in servers:
            raise ValueError(f"--compare-static names {name!r} twice")
        servers[name] = url
    missing = {"adaptive", "plain"} - set(servers)
    if missing:
        raise ValueError(f"--compare-static needs servers named {' and '.join(sorted(missing))} "
                         f"(e.g. adaptive=http://127.0.0.1:8000,plain=http://127.0.0.1:8001)")
    return servers


def run_serve_compare(config: ServeBenchConfig, servers: dict[str, str], output_dir: str | Path,
                      command_line: str) -> dict:
    """Every server through the same sweep (`config` with each url); writes compare.json and one
    compare_T{t}.png per temperature into `output_dir`; returns the document."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    records = []
    for name, url in servers.items():
        doc = asyncio.run(run_sweep(replace(config, url=url)))
        records += [{**r, "configuration": name, "server_url": url, "tok_s": r["output_tok_s"]} for r in doc["records"]]
    document = {"command": command_line, "timestamp": started, "servers": servers, "records": records,
                "summary": {}, "plots": {}}
    for t in config.temperatures:
        cell = [r for r in records if r["temperature"] == t]
        document["summary"][f"{t:g}"] = summarise(cell)
        name = f"compare_T{t:g}.png"
        plot_compare({"records": cell, "concurrencies": config.concurrencies, "spec": "served",
                      "temperature": t}, out / name)
        document["plots"][f"{t:g}"] = name
    (out / "compare.json").write_text(json.dumps(document, indent=2))
    return document


def format_serve_compare(document: dict) -> str:
    lines = ["temp  conc  best static        best tok/s  adaptive tok/s  ÷ best  ÷ plain"]
    for t, rows in document["summary"].items():
        for s in rows:
            ratio = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
            lines.append(f"{t:>4}  {s['concurrency']:>4}  {s['best_static']:<17} {s['best_static_tok_s']:>10.1f}  "
                         f"{s['adaptive_tok_s'] or 0:>14.1f}  {ratio(s['adaptive_vs_best_static']):>6}  "
                         f"{ratio(s['adaptive_vs_plain']):>7}")
    return "\n".join(lines)
