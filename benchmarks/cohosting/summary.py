"""What ``models.py`` makes of its measurements: the targets, the replies summed, the markdown."""

from __future__ import annotations

from typing import Any

from lib.report import describe_cpu, format_load

from cohosting.load import COSINE_MIN, Tally

NEIGHBOUR_TARGET = 0.8  # each model's sentences/s with a neighbour, over a's alone


def verdict(report: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The targets, and the replies that were not right (wrong, crossed or failed)."""
    ratios = report["throughput"]["ratio"]
    isolation = report["flood"]
    machine = report["throughput"]["machine_pair_ratio"]
    targets = [
        {
            "target": f"{m} with a neighbour / a alone >= {NEIGHBOUR_TARGET}",
            "measured": f"{ratios[m]:.2f} (the machine's own: {machine:.2f})",
            "passed": ratios[m] is not None and ratios[m] >= NEIGHBOUR_TARGET,
        }
        for m in report["models"]
    ]
    job = isolation["b_job_ms"]["status_bulk_median"]
    targets.append(
        {
            "target": "a's one-sentence p50 grows by at most one model run of b",
            "measured": f"{isolation['p50_growth_ms']:+.1f} ms against {job:.0f} ms",
            "passed": isolation["p50_growth_ms"] <= job,
        }
    )
    bad = sum(tally["wrong"] + tally["crossed"] + tally["failed"] for tally in all_replies(report))
    targets.append({"target": "0 wrong, 0 crossed, 0 failed", "measured": bad, "passed": bad == 0})
    return targets, bad


def all_replies(report: dict[str, Any]) -> list[dict[str, Any]]:
    steps = [s for r in report["throughput"]["rounds"] for s in (r["alone"], r["neighbour"])]
    return [result["replies"] for step in steps for result in step.values()] + list(report["flood"]["replies"].values())


def summed(replies: list[dict[str, Any]]) -> dict[str, Any]:
    total = Tally()
    for tally in replies:
        total.merge(Tally(**tally))
    return total.as_dict()


def markdown(report: dict[str, Any]) -> str:
    mem, thr, fl = report["memory"], report["throughput"], report["flood"]
    load = report["load_average"]
    labels = {"one": "one model (a)", "two": "two models (a, b)", "extra_model": "**the second model**"}
    rows = [_memory_row(label, mem[key]) for key, label in labels.items()]
    rounds = " · ".join(
        f"{r['alone']['a']['sentences_per_s']:,.0f} → {r['neighbour']['a']['sentences_per_s']:,.0f} + "
        f"{r['neighbour']['b']['sentences_per_s']:,.0f} (load average {r['load_average'][0]:.2f} at its start)"
        for r in thr["rounds"]
    )
    beside = [
        f"| {m} beside the other (server `two`) | {thr['neighbour_sentences_per_s'][m]:,.0f} | "
        f"{thr['ratio'][m]:.2f} | {thr['ratio_of_machine'][m]:.2f} |"
        for m in report["models"]
    ]
    by_round = "; ".join(f"{m} {', '.join(f'{x:.2f}' for x in thr['ratio_by_round'][m])}" for m in report["models"])
    machine = ", ".join(f"{r['machine']['ratio']:.2f}" for r in thr["rounds"])
    a, job = fl["a_ms"], fl["b_job_ms"]
    window_mean = "n/a" if job["window_mean"] is None else f"{job['window_mean']:.0f} ms"
    per_job = "n/a" if job["window_sentences_per_job"] is None else f"{job['window_sentences_per_job']:.0f}"
    busy = "n/a" if job["window_busy_fraction"] is None else f"{100 * job['window_busy_fraction']:.0f} %"
    total = report["replies_total"]
    lines = [
        f"# Several models behind one head ({report['model_name']}, CPU, fp32)",
        "",
        f"Machine: {describe_cpu(report['environment'])}; load average {format_load(load['start'])} at the start, "
        f"{format_load(load['end'])} at the end. Servers `one` (`--model a=DIR`) and `two` (`--model a=DIR --model "
        "b=DIR,pooling_strategy=CLS_TOKEN`), both `--cpu --dtype fp32 --max-seq-len "
        f"{report['max_seq_len']} --num-worker 1 --threads-per-worker 1`, up side by side; "
        f"{report['corpus_sentences']:,} corpus sentences. The two models' vectors of a sentence: median cosine "
        f"{report['cross_model_cosine']:.3f}, so a reply of the wrong model cannot pass the check.",
        "",
        "## Memory after a warm-up, settled, MiB",
        "",
        "| server | head RSS | workers RSS | total RSS | head PSS | workers PSS | total PSS |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        "Head: the server process and its helpers (sink); workers: the processes STATUS lists as workers. RSS: the "
        "median of 5 reads 0.5 s apart, 2 s after the warm-up; PSS (one read after them) counts a page shared by n "
        "processes (TensorFlow's libraries, say) 1/n in each, so its growth is what the machine spends.",
        "",
        f"## Throughput with a neighbour: {report['clients']} clients per model, {report['request_size']} "
        f"sentences a request, {report['seconds']:g} s a step",
        "",
        "| | sentences/s (median) | / a alone | / the machine's ratio |",
        "| --- | ---: | ---: | ---: |",
        f"| a alone (server `one`) | {thr['alone_sentences_per_s']:,.0f} | 1 | |",
        *beside,
        "",
        f"Rounds (a alone → a + b with a neighbour): {rounds}. Ratios by round: {by_round}.",
        "",
        f"The machine's ratio: two one-thread processes multiplying at the model's widest shape (1,536 x 384 by "
        f"384 x 1,536, one BLAS thread each) at once each run {thr['machine_pair_ratio']:.2f} of one alone (median; "
        f"by round {machine}). That is the ceiling of the ratio above for any server: two one-thread workers on "
        "this machine's two CPUs cannot both run at full speed.",
        "",
        f"## Flood isolation: a's one-sentence requests while {fl['flood_clients']} processes keep "
        f"{fl['bulk_size']:,}-sentence requests to b in flight",
        "",
        "| a, one sentence at a time | p50 ms | p99 ms | requests |",
        "| --- | ---: | ---: | ---: |",
        f"| idle, before and after the flood (p50 {a['idle']['p50_before']:.1f} and {a['idle']['p50_after']:.1f}) "
        f"| {a['idle']['p50']:.1f} | {a['idle']['p99']:.1f} | {a['idle']['count']} |",
        f"| b flooded | {a['flood']['p50']:.1f} | {a['flood']['p99']:.1f} | {a['flood']['count']} |",
        f"| growth | {fl['p50_growth_ms']:+.1f} | {fl['p99_growth_ms']:+.1f} | |",
        "",
        f"One model run of b, the yardstick: {job['status_bulk_median']:.0f} ms, the median run time of its bulk "
        "jobs (STATUS `recent_jobs.bulk_median_seconds` at the end of the flood; only b ran bulk jobs). Over the "
        f"window b's worker ran {job['window_jobs']} jobs of {per_job} sentences on average, {window_mean} each "
        f"(its `busy_s` / `jobs_done`); its `busy_s`, counted as jobs end, grew by {busy} of the window. a's "
        f"p50 grew by {100 * fl['growth_over_b_job']:.1f} % of one run of b.",
        "",
        "## Targets",
        "",
        "| target | measured | result |",
        "| --- | --- | --- |",
        *(f"| {t['target']} | {t['measured']} | {'PASS' if t['passed'] else 'MISS'} |" for t in report["targets"]),
        "",
        f"Every reply checked against the in-process `Encoder` (cosine >= {COSINE_MIN}): {total['requests']:,} "
        f"requests, {total['sentences']:,} sentences; {total['wrong']} wrong, {total['crossed']} crossed, "
        f"{total['failed']} failed; least cosine {total['min_cosine']:.6f}; b's flood refused busy "
        f"{fl['replies']['b_flood']['busy']} times (retried).",
    ]
    return "\n".join(lines) + "\n"


def _memory_row(label: str, memory: dict[str, Any]) -> str:
    sign = "+" if "second" in label else ""
    keys = [f"{role}_{unit}" for unit in ("mib", "pss_mib") for role in ("head", "workers", "total")]
    return f"| {label} | " + " | ".join(f"{memory[key]:{sign},.0f}" for key in keys) + " |"
