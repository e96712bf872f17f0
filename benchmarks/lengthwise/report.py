"""The report of ``lengths.py``: its markdown and its plot (inputs/s and p50 ms against
length)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lib.report import describe_cpu, pyplot

from lengthwise.plan import COLOURS, MAX_SEQ_LEN, SERVER, SERVER_FLAGS, TARGETS, log


def markdown(report: dict[str, Any]) -> str:
    rows, plan = report["rows"], report["plan"]
    bulk_names = list(rows[0]["bulk"])
    single_names = list(rows[0]["single"])
    sizes = ", ".join(f"{r['bulk_inputs']} at {r['tokens']}" for r in rows)
    lines = [
        "# bertserve by input length: bulk and one input at a time",
        "",
        f"Command: `{report['command']}`",
        "",
        f"CPU: {describe_cpu(report['environment'])}. Load average {report['load_average']['start']} at the start, "
        f"{report['load_average']['end']} at the end; {report['seconds']:.0f} s in all.",
        "",
        f"Model `{report['model_dir']}`, `max_seq_len` {MAX_SEQ_LEN} (nothing truncated). Inputs of exactly the "
        f"tokens shown (`[CLS]` and `[SEP]` included), cut from `{report['corpus']}` run together and counted by "
        "the model's tokenizer and by the `Encoder`'s, a different text each. Bulk: one call of "
        f"{plan['bulk_tokens']:,} tokens per run ({sizes} inputs), median of {plan['repeats']} runs in turns; "
        f"one input at a time: p50 of {plan['repeats']} x {plan['single']} inputs, {plan['warmup']} of warm-up "
        "before each run. Each in-process contender in a process of its own.",
        "",
        "| contender | how | setup s |",
        "| --- | --- | ---: |",
    ]
    for name, info in report["contenders"].items():
        lines.append(f"| {name} | {info['note']} | {info['setup_s']:.1f} |")
    if report["server"]:
        server = report["server"]
        ready = server["ready_line"].replace("|", "\\|")
        lines.append(f"| {SERVER} | `{' '.join(SERVER_FLAGS)}`: {ready} | {server['ready_s']:.1f} |")
    lines += ["", "Bulk, inputs/s (median):", "", _header(bulk_names)]
    for r in rows:
        lines.append(f"| {r['tokens']} | " + " | ".join(f"{r['bulk'][n]['per_s']:,.1f}" for n in bulk_names) + " |")
    lines += ["", "One input at a time, p50 ms (p90 in brackets):", "", _header(single_names)]
    for r in rows:
        cells = [f"{r['single'][n]['p50_ms']:.1f} ({r['single'][n]['p90_ms']:.1f})" for n in single_names]
        lines.append(f"| {r['tokens']} | " + " | ".join(cells) + " |")
    lines += ["", "Targets, bertserve being the in-process `Encoder` at auto:", ""]
    lines.append(_header([f"{t.name} ({t.goal_text})" for t in TARGETS]))
    for r in rows:
        cells = [_target_cell(r["targets"][t.name]) for t in TARGETS]
        lines.append(f"| {r['tokens']} | " + " | ".join(cells) + " |")
    least = {name: min(r["min_cosine"][name] for r in rows) for name in rows[0]["min_cosine"]}
    if least:
        lines += [
            "",
            "Least cosine to the `Encoder` at fp32 on the warm-up batches' first rows: "
            + ", ".join(f"{name} {value:.4f}" for name, value in least.items())
            + ".",
        ]
    return "\n".join(lines) + "\n"


def _target_cell(measured: dict[str, Any]) -> str:
    if measured["verdict"] == "n/a":
        return "n/a"
    return f"{measured['value']:.2f} {measured['verdict']}"


def _header(names: Sequence[str]) -> str:
    return "| tokens | " + " | ".join(names) + " |\n| ---: |" + " ---: |" * len(names)


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    rows = report["rows"]
    lengths = [r["tokens"] for r in rows]
    fig, (bulk, single) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in rows[0]["bulk"]:
        bulk.plot(lengths, [r["bulk"][name]["per_s"] for r in rows], marker="o", color=COLOURS[name], label=name)
    p50s = {name: [r["single"][name]["p50_ms"] for r in rows] for name in rows[0]["single"]}
    for name, values in p50s.items():
        single.plot(lengths, values, marker="o", color=COLOURS[name], label=name)
    bulk.set_yscale("log")
    bulk.set_ylabel("inputs/s (log)")
    bulk.set_title("Bulk (higher is better)")
    every = [v for values in p50s.values() for v in values if not math.isnan(v)]
    wide = bool(every) and max(every) > 30 * min(every)  # sentence-transformers alone would flatten the rest
    single.set_yscale("log" if wide else "linear")
    single.set_ylabel("p50 ms" + (" (log)" if wide else ""))
    single.set_title("One input at a time (lower is better)")
    for ax in (bulk, single):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.set_xlabel("tokens per input")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")
