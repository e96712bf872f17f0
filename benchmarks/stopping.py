"""The stop table: how long a stop takes and what each caller is told, with the real model.

One ``bertserve start --http-port`` server of all-MiniLM-L6-v2 (by default), one worker as a
container runs it, and the default stop budget (``--stop-timeout`` 8 s, inside Docker's
default grace of 10 s). Each row starts a fresh server, has four callers send one request of
N texts of about 100 words each (two over HTTP with httpx, two over ZeroMQ with
``BertClient``), waits until all four are in flight and a worker runs, then stops the server
as a process manager would:

- SIGTERM to the main process (``docker stop``, Kubernetes), with nothing, 4 x 40 and
  4 x 400 texts in flight;
- SIGTERM to the whole process group (systemd's default ``KillMode``, ``timeout``) and
  Ctrl-C twice, with 4 x 400 texts in flight.

Each row gives the time from the signal to the exit, the exit code, the ERROR lines the server
logged, and what the callers got: 200, 503 ``shutdown``, or anything else (a connection closed
without a response, a timeout), which the stop must never cause. The target: every row within
10 s, exit code 0, no ERROR, every caller 200 or 503.

    python benchmarks/stopping.py --markdown benchmarks/report/stopping.md --json benchmarks/report/stopping.json
"""

from __future__ import annotations

import collections
import os
import re
import signal
import time
from collections.abc import Callable
from typing import Any

from bertserve.server.config.stopping import STOP_TIMEOUT_SECONDS
from bertserve.server.testing.launcher import RunningServer, free_port, start_server
from bertserve.server.testing.stop_callers import Answer, start_callers, stop_and_wait, wait_in_flight
from lib.inputs import model_dir_or_exit, model_parser
from lib.report import Progress, describe_cpu, environment, format_load, write_report

GRACE_S = 10.0  # Docker's default: past it, the runtime kills the server
WORDS = 100  # a text's words: past the model's 256 tokens with its pieces, cut (truncate: true)
ERROR = re.compile(r"\b(ERROR|CRITICAL|Traceback)\b")
ROWS = (  # (how it is stopped, texts each of the four callers sends)
    ("SIGTERM", 0),
    ("SIGTERM", 40),
    ("SIGTERM", 400),
    ("SIGTERM to the group", 400),
    ("SIGINT twice", 400),
)


def _ask(server: RunningServer, how: str) -> Callable[[], None]:
    group = os.getpgid(server.process.pid)

    def ask() -> None:
        if how == "SIGTERM":
            server.process.send_signal(signal.SIGTERM)
        elif how == "SIGTERM to the group":
            os.killpg(group, signal.SIGTERM)
        else:
            os.killpg(group, signal.SIGINT)
            deadline = time.monotonic() + 5
            while "Ctrl-C again" not in "".join(server.output) and time.monotonic() < deadline:
                time.sleep(0.02)
            os.killpg(group, signal.SIGINT)

    return ask


def run_row(model_dir: str, how: str, texts: int, log: Progress) -> dict[str, Any]:
    http_port = free_port()
    server = start_server(
        "--model-dir", model_dir, "--num-worker", "1", "--http-port", str(http_port), "--cpu", echo=False
    )
    load = os.getloadavg()
    answers: list[Answer] = []
    threads = start_callers(server, http_port, texts, answers, words=WORDS) if texts else []
    if texts:
        wait_in_flight(server, 4, timeout=60)
    took, code, output = stop_and_wait(server, _ask(server, how), STOP_TIMEOUT_SECONDS)
    for thread in threads:
        thread.join(120)
    outcomes: dict[str, collections.Counter[str]] = {"HTTP": collections.Counter(), "ZeroMQ": collections.Counter()}
    for answer in answers:
        outcomes["HTTP" if answer.caller.startswith("http") else "ZeroMQ"][answer.outcome] += 1
    row = {
        "how": how,
        "texts": texts,
        "load": load,
        "took_s": took,
        "exit_code": code,
        "errors": [line for line in output.splitlines() if ERROR.search(line)],
        "http": dict(outcomes["HTTP"]),
        "zeromq": dict(outcomes["ZeroMQ"]),
        "stopped_line": next((line for line in output.splitlines() if "bertserve stopped" in line), ""),
    }
    row["ok"] = (
        took < GRACE_S
        and code == 0
        and not row["errors"]
        and all(a.outcome in ("200", "503 shutdown") for a in answers)
        and len(answers) == (4 if texts else 0)
    )
    log(f"{how}, 4 x {texts}: {took:.1f} s, exit {code}, HTTP {row['http']}, ZeroMQ {row['zeromq']}")
    return row


def _told(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} x {outcome}" for outcome, n in sorted(counts.items())) or "-"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# The stop table: the whole stop within its budget, every caller told",
        "",
        f"Written by `python benchmarks/stopping.py` on {report['date']}, with {report['model']}, one worker, "
        f"`--stop-timeout` {STOP_TIMEOUT_SECONDS:g} s (the default), and texts of about {WORDS} words "
        "(cut to the model's 256 tokens).",
        "",
        "| how it was stopped | requests in flight | load average | took | exit code | HTTP callers got "
        "| ZeroMQ callers got | ERROR lines | within 10 s, exit 0, every caller 200 or 503 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["rows"]:
        flight = f"4 x {row['texts']} texts" if row["texts"] else "none"
        lines.append(
            f"| {row['how']} | {flight} | {format_load(row['load'][:1])} | {row['took_s']:.1f} s | {row['exit_code']} "
            f"| {_told(row['http'])} | {_told(row['zeromq'])} | {len(row['errors'])} | {'yes' if row['ok'] else 'NO'} |"
        )
    lines += [
        "",
        "Took: from the signal to the server's exit (every process of it gone). The server's own count, from the "
        "signal to its last log line, is in the JSON (`stopped_line`). A 503 is `shutdown`: over HTTP with "
        "`Connection: close`, over ZeroMQ a `ServerError` of kind `shutdown`.",
        "",
        f"CPU: {describe_cpu(report['environment'])}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = model_parser(__doc__ or "")
    args = parser.parse_args()
    model_dir = model_dir_or_exit(parser, args.model_dir)
    log = Progress()
    rows = [run_row(str(model_dir), how, texts, log) for how, texts in ROWS]
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "model": "all-MiniLM-L6-v2" if args.model_dir is None else model_dir.name,
        "stop_timeout_s": STOP_TIMEOUT_SECONDS,
        "rows": rows,
        "environment": environment(),
    }
    write_report(report, markdown(report), args.json, args.markdown)


if __name__ == "__main__":
    main()
