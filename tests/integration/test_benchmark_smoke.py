"""Smoke tests of benchmarks/suite.py (both sub-commands with ``--quick``), of
benchmarks/models.py (seconds-long steps), on a tiny BERT, and of benchmarks/tracing.py and
benchmarks/grpc_vs_http.py (a few requests a step), on its fast stand-in, and of
benchmarks/static_vs_model2vec.py and benchmarks/multivector.py on tiny models of their own.

Each runs as a subprocess, exactly as a user runs it; it starts its own servers on free
ports. This checks that it finishes, and that its JSON, markdown and plots hold what they
should, not the numbers. Without matplotlib (``requirements-bench.txt``) the plots are left
out and the rest is still checked. Every one starts several servers: they are ``slow``, run
in a pass of their own.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "suite.py"
MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LATENCY_KEYS = {"p50", "p90", "p99"}
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

pytestmark = pytest.mark.slow


def run_suite(command: str, model_dir: str, graph_dir: str, out: Path, *extra: str) -> dict[str, Any]:
    """Run ``suite.py COMMAND --quick`` writing into ``out``; return its JSON report."""
    args = [
        sys.executable,
        str(SUITE),
        command,
        "--quick",
        "--model-dir",
        model_dir,
        "--graph-dir",
        graph_dir,
        "--json",
        str(out / f"{command}.json"),
        "--markdown",
        str(out / f"{command}.md"),
        *extra,
    ]
    if HAVE_MATPLOTLIB:
        args += ["--plots", str(out / "plots")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=240, cwd=out)
    assert done.returncode == 0, f"exit code {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return json.loads((out / f"{command}.json").read_text(encoding="utf-8"))


def assert_png(path: Path) -> None:
    if not HAVE_MATPLOTLIB:
        return
    assert path.is_file(), f"{path} was not written"
    assert path.read_bytes()[:8] == PNG_SIGNATURE, f"{path} is not a PNG"


@pytest.mark.timeout(300)
def test_sweep_quick(tiny_google: str, session_graph_dir: str, tmp_path: Path) -> None:
    report = run_suite("sweep", tiny_google, session_graph_dir, tmp_path)

    assert report["kind"] == "sweep" and report["quick"] is True
    values = {(p["parameter"], p["value"]) for p in report["points"]}
    assert values == {
        ("client-batch", "1"),
        ("client-batch", "16"),
        ("clients", "1"),
        ("clients", "4"),
        ("dtype", "fp32"),
        ("dtype", "bf16"),
    }
    for point in report["points"]:
        assert point["errors"] == [], point
        assert point["requests"] > 0 and point["sentences_per_second"] > 0, point
        assert set(point["latency_ms"]) == LATENCY_KEYS
        assert 0 < point["latency_ms"]["p50"] <= point["latency_ms"]["p99"], point
        assert point["peak_rss_mib"] > 0
        assert point["padding_fraction"] is not None and 0 <= point["padding_fraction"] < 1
    bases = {p["parameter"]: p["value"] for p in report["points"] if p["is_base"]}
    assert bases == {"client-batch": "16", "clients": "1", "dtype": "fp32"}
    assert {p["server"]["dtype"] for p in report["points"] if p["parameter"] == "dtype"} == {"fp32", "bf16"}

    for name in ("sweep.png", "sweep_client-batch.png", "sweep_clients.png", "sweep_dtype.png"):
        assert_png(tmp_path / "plots" / name)
    assert "| dtype | bf16 |" in (tmp_path / "sweep.md").read_text(encoding="utf-8")


BASE_ROWS = {
    "server fp32",
    "server bf16",
    "Encoder fp32",
    "Encoder bf16",
    "single-sentence clients, merging on",
    "single-sentence clients, merging off",
}
INT8_ROWS = {"server int8", "Encoder int8"}  # where this bertserve serves int8
NOT_MEASURED_HERE = ("sentence-transformers", "int8", "auto")  # left out of the smoke run, or not yet served
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # as benchmarks/lib/report.py reads them
INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")


@pytest.mark.timeout(300)
def test_compare_quick(tiny_google: str, session_graph_dir: str, tmp_path: Path) -> None:
    report = run_suite("compare", tiny_google, session_graph_dir, tmp_path, "--no-sentence-transformers", "--no-onnx")

    assert report["kind"] == "compare"
    assert "--no-sentence-transformers" in report["skipped"] and "--no-onnx" in report["skipped"]
    rows = {row["name"]: row for row in report["throughput"]}
    assert BASE_ROWS <= set(rows) <= BASE_ROWS | INT8_ROWS
    for row in rows.values():
        assert row["median_sentences_per_second"] > 0 and len(row["runs"]) == 1, row
        assert row["ratio_to_sentence_transformers"] is None
        assert row["of_fp32_ceiling"] > 0, row

    latency = report["latency"]
    assert set(latency["idle"]) == set(latency["under_load"]) == LATENCY_KEYS
    assert latency["idle_requests"] > 0 and latency["load_requests"] > 0
    assert latency["bulk_job_seconds"] > 0 and latency["limit_ms"] > latency["idle"]["p50"]
    assert 0 <= report["padding_fraction"]["server fp32"] < 1
    assert {"server fp32", "server bf16", "server fp32 no-merge"} <= set(report["peak_rss_mib"])
    assert all(memory["serving"] > 0 for memory in report["peak_rss_mib"].values())
    startup = report["startup"]
    assert len(startup["cold_seconds"]) == len(startup["warm_seconds"]) == 1
    assert startup["median_cold_seconds"] > 0 and startup["median_warm_seconds"] > 0
    assert report["single_sentence_p50_ms"]["server fp32"] > 0
    assert report["accuracy"]["Encoder bf16"]["reference"] == "Encoder fp32"

    roofline = report["roofline"]
    assert roofline["error"] is None and roofline["rates"]["fp32"]["gflops"] > 0
    assert roofline["ceilings"]["fp32"] > 0 and roofline["tokens_per_sentence"] > 0
    assert report["environment"]["cpu"] and isinstance(report["environment"]["cpu_flags"], list)

    # The bf16 targets depend on the CPU, as the report says it: with native bf16 the benchmark
    # checks bf16's speed and accuracy (2 targets, both measured) and the default dtype against
    # the bf16 ceiling (about auto, which the smoke run leaves out), without it that --dtype auto
    # costs nothing (1 target, about auto); with int8 units, int8 against bf16 (not measured here).
    native_bf16 = any(flag in report["environment"]["cpu_flags"] for flag in NATIVE_BF16_FLAGS)
    int8_units = any(flag in report["environment"]["cpu_flags"] for flag in INT8_FLAGS)
    targets = {t["name"]: t for t in report["targets"]}
    assert len(targets) == 15 + 2 * native_bf16 + int8_units, sorted(targets)
    assert ("server bf16 / server fp32 (native bf16)" in targets) == native_bf16
    assert ("server auto / bf16 matmul ceiling" in targets) == native_bf16
    assert ("server int8 / server bf16 (int8 units)" in targets) == int8_units
    assert targets["server fp32 / sentence-transformers"]["passed"] is None  # skipped, so not measured
    measured = [t for t in targets.values() if not any(word in t["name"] for word in NOT_MEASURED_HERE)]
    assert len(measured) == (9 if native_bf16 else 7), [t["name"] for t in measured]
    assert all(t["measured"] is not None and t["passed"] in (True, False) for t in measured), measured

    assert_png(tmp_path / "plots" / "compare.png")
    markdown = (tmp_path / "compare.md").read_text(encoding="utf-8")
    assert "| target | measured | goal | result | detail |" in markdown
    assert "| dtype | GFLOP/s | runs | ceiling, sentences/s | how |" in markdown


@pytest.mark.timeout(180)
def test_models_quick(tiny_google: str, session_graph_dir: str, tmp_path: Path) -> None:
    args = [
        sys.executable,
        str(MODELS),
        "--model-dir",
        tiny_google,
        "--graph-dir",
        session_graph_dir,
        "--max-seq-len",
        "32",
        "--limit",
        "100",
        "--seconds",
        "1",
        "--rounds",
        "1",
        "--clients",
        "2",
        "--request-size",
        "8",
        "--small-requests",
        "10",
        "--bulk-size",
        "300",
        "--flood-clients",
        "1",
        "--flood-ramp",
        "0.5",
        "--machine-seconds",
        "0.2",
        "--json",
        str(tmp_path / "models.json"),
        "--markdown",
        str(tmp_path / "models.md"),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=170, cwd=tmp_path)
    assert done.returncode == 0, f"exit code {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    report = json.loads((tmp_path / "models.json").read_text(encoding="utf-8"))

    assert report["kind"] == "models" and report["stop_problems"] == []
    memory = report["memory"]
    assert len(memory["one"]["each_worker_mib"]) == 1 and len(memory["two"]["each_worker_mib"]) == 2
    for server in ("one", "two"):
        assert memory[server]["head_mib"] > 0 and memory[server]["workers_mib"] > 0, memory
        assert memory[server]["total_pss_mib"] > 0, memory
    assert set(memory["extra_model"]) == {
        "head_mib",
        "workers_mib",
        "total_mib",
        "head_pss_mib",
        "workers_pss_mib",
        "total_pss_mib",
    }

    throughput = report["throughput"]
    (round_,) = throughput["rounds"]
    assert round_["alone"]["a"]["sentences_per_s"] > 0
    assert round_["neighbour"]["a"]["sentences_per_s"] > 0 and round_["neighbour"]["b"]["sentences_per_s"] > 0
    assert set(throughput["ratio"]) == {"a", "b"} and all(r > 0 for r in throughput["ratio"].values())
    assert round_["machine"]["alone_per_s"] > 0 and len(round_["machine"]["pair_per_s"]) == 2
    assert throughput["machine_pair_ratio"] > 0 and set(throughput["ratio_of_machine"]) == {"a", "b"}

    flood = report["flood"]
    assert flood["a_ms"]["idle"]["count"] == 2 * flood["a_ms"]["flood"]["count"] == 20  # idle before and after
    assert 0 < flood["a_ms"]["idle"]["p50"] <= flood["a_ms"]["idle"]["p99"]
    assert flood["replies"]["b_flood"]["ok"] > 0 and flood["b_job_ms"]["status_bulk_median"] > 0

    total = report["replies_total"]
    assert total["ok"] > 0 and total["wrong"] == total["crossed"] == total["failed"] == 0, total
    assert total["min_cosine"] >= 0.99999
    assert len(report["targets"]) == 4 and report["targets"][-1]["passed"] is True
    markdown = (tmp_path / "models.md").read_text(encoding="utf-8")
    assert "| target | measured | result |" in markdown and "the second model" in markdown


@pytest.mark.timeout(300)
def test_tracing_benchmark_runs_three_servers_and_gets_the_traces(tiny_google: str, tmp_path: Path) -> None:
    """benchmarks/tracing.py with a baseline of this checkout's HEAD (its code run from a
    ``git archive``), traces off and on: every server measured, the targets judged, and the
    traced server's spans received."""
    script = SUITE.parent / "tracing.py"
    args = [sys.executable, str(script), "--model-dir", tiny_google, "--baseline", "HEAD", "--rounds", "2"]
    args += ["--model-class", "bertserve.server.model.interface:HashingModel", "--export-every-ms", "100"]
    args += ["--sentences", "10", "--warmup", "2", "--bulk", "40", "--json", str(tmp_path / "tracing.json")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert done.returncode == 0, f"exit code {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    report = json.loads((tmp_path / "tracing.json").read_text(encoding="utf-8"))
    assert set(report["summary"]["medians"]) == {"baseline", "traces off", "traces on"}
    for medians in report["summary"]["medians"].values():
        assert medians["one_p50_ms"] > 0 and medians["http_p50_ms"] > 0 and medians["bulk_per_s"] > 0
    assert len(report["summary"]["targets"]) == 6
    assert report["traces"] >= 2 * 12 * 2  # every one-sentence request of the traced server, ZeroMQ and HTTP
    assert "CPU:" in done.stdout


@pytest.mark.timeout(240)
def test_grpc_vs_http_benchmark_measures_every_path(tiny_google: str, tmp_path: Path) -> None:
    """benchmarks/grpc_vs_http.py on a server of the fast HashingModel, every step a few requests:
    every path measured without an error, the targets judged, and the vectors of gRPC and HTTP
    the same."""
    script = SUITE.parent / "grpc_vs_http.py"
    args = [sys.executable, str(script), "--model-dir", tiny_google, "--max-seq-len", "32"]
    args += ["--model-class", "bertserve.server.model.interface:HashingModel", "--sentences", "10", "--warmup", "2"]
    args += ["--bulk-sentences", "300", "--bulk-size", "100", "--bulk-rounds", "1", "--callers", "4"]
    args += ["--seconds", "0.5", "--concurrent-rounds", "1", "--check", "8"]
    args += ["--json", str(tmp_path / "grpc.json"), "--markdown", str(tmp_path / "grpc.md")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=230, cwd=tmp_path)
    assert done.returncode == 0, f"exit code {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    report = json.loads((tmp_path / "grpc.json").read_text(encoding="utf-8"))
    assert set(report["one_sentence"]) == {"gRPC Embed", "HTTP /embed, httpx", "HTTP /v1/embeddings, http.client"}
    assert all(0 < row["p50_ms"] <= row["p99_ms"] and row["count"] == 10 for row in report["one_sentence"].values())
    assert set(report["bulk"]) == {"gRPC EmbedStream", "HTTP /embed"}
    for row in report["bulk"].values():
        assert row["per_s"] > 0 and len(row["seconds"]) == 1 and row["jobs"] >= 1, row
        assert set(row["cpu_s_per_1000"]) == {"client", "HTTP", "gRPC", "worker", "head and helpers"}, row
    assert len(report["concurrent"]) == 3
    for row in report["concurrent"].values():
        assert row["requests_per_s"] > 0 and row["errors"] == {} and row["requests_per_job"] >= 1, row
    assert report["identical"]["identical"] is True and report["identical"]["sentences"] == 8
    assert len(report["targets"]) == 6 and report["targets"][-1]["passed"] is True
    markdown = (tmp_path / "grpc.md").read_text(encoding="utf-8")
    assert "| target | measured | goal | result |" in markdown and "CPU:" in markdown


@pytest.mark.timeout(240)
def test_static_vs_model2vec_benchmark_measures_both_sides(tmp_path: Path) -> None:
    """benchmarks/static_vs_model2vec.py --quick: a tiny static model made by model2vec, served and
    encoded in process; both sides measured, the ratio judged, the vectors the same."""
    pytest.importorskip("model2vec")
    script = SUITE.parent / "static_vs_model2vec.py"
    args = [
        sys.executable,
        str(script),
        "--quick",
        "--json",
        str(tmp_path / "s.json"),
        "--markdown",
        str(tmp_path / "s.md"),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=230, cwd=tmp_path)
    assert done.returncode == 0, f"exit code {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    report = json.loads((tmp_path / "s.json").read_text(encoding="utf-8"))
    assert all(row["per_s"] > 0 and len(row["seconds"]) == 2 for row in report["bulk"].values())
    assert report["ratio"] > 0 and report["min_cosine"] > 0.99999
    assert "CPU:" in (tmp_path / "s.md").read_text(encoding="utf-8")


@pytest.mark.timeout(240)
def test_multivector_benchmark_measures_dense_against_all_three(tmp_path: Path) -> None:
    """benchmarks/multivector.py --quick: the tiny BGE-M3 of tests/data/multivector (no PyTorch),
    dense alone against all three outputs, in process and through a server; both sides timed in
    every round, the ratio reported and judged."""
    script = SUITE.parent / "multivector.py"
    out = [str(tmp_path / "m.json"), str(tmp_path / "m.md")]
    args = [sys.executable, str(script), "--quick", "--json", out[0], "--markdown", out[1]]
    done = subprocess.run(args, capture_output=True, text=True, timeout=230, cwd=tmp_path)
    assert done.returncode == 0, f"exit code {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    report = json.loads((tmp_path / "m.json").read_text(encoding="utf-8"))
    assert set(report["results"]) == {"in process, fp32", "server, fp32"}
    for row in report["results"].values():
        assert all(len(side["seconds"]) == 2 and side["median_s"] > 0 for side in row["sides"].values())
        assert row["ratio"] > 0 and len(row["round_ratios"]) == 2
    assert report["tokens"] > 0 and isinstance(report["met"], bool)
    markdown = (tmp_path / "m.md").read_text(encoding="utf-8")
    assert "all three / dense" in markdown and "CPU:" in markdown
