"""int8, product by product: how far each of a model's matrix products moves the vectors.

The fp32 graph is converted to LiteRT with every matrix product in int8 (weights per output
channel, activations per row; the embedding tables stay fp32), and products are then put
back into fp32 (the graph's own weights) to see what each costs: one layer in int8 and the
rest fp32, one kind of product (qkv, attn_out, ffn_in, ffn_out) in int8 and the rest fp32,
every product in int8, and what ``--dtype int8`` runs (``server/model/int8.py``'s
``KEEP_FLOAT``). Each is compared with the fp32 graph's vectors (min and mean cosine) on the
corpus and the reference sentences, and timed in bulk on the same runs. This is the
measurement behind ``KEEP_FLOAT``.

    python benchmarks/int8_layers.py --corpus benchmarks/data/corpus-long.txt \\
        --json benchmarks/results/int8_layers.json --markdown benchmarks/results/int8_layers.md
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from lib.inputs import BENCHMARKS_DIR, model_dir_or_exit, model_parser, read_corpus
from lib.report import describe_cpu, environment, tagged_log, write_report
from lib.stats import cosine_rows

REFERENCE_SENTENCES = BENCHMARKS_DIR.parent / "tests" / "data" / "sentences.json"

log = tagged_log("int8")


def main(argv: list[str] | None = None) -> int:
    parser = model_parser(__doc__)
    parser.add_argument("--limit", type=int, default=1000, help="corpus sentences to compare (default: 1000)")
    parser.add_argument("--max-seq-len", type=int, default=128)
    args = parser.parse_args(argv)
    model_dir = model_dir_or_exit(parser, args.model_dir)
    from bertserve.server.model import int8, lite
    from bertserve.server.model.encoder import Encoder

    texts = read_corpus(args.corpus, args.limit) + json.loads(REFERENCE_SENTENCES.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="bertserve-int8-") as graph_dir:
        encoder = Encoder(model_dir, max_seq_len=args.max_seq_len, dtype="fp32", lite_max_tokens=0, graph_dir=graph_dir)
        found = lite.read_graph_def(graph_dir, encoder.meta.key)
        assert found is not None, "the fp32 graph was not cached"
        base = encoder.encode(texts)
        every = int8.convert(*found, keep_float=())
        exact = int8.exact_weights(found[0], lambda name: True)  # a product put back takes its fp32 weight
        products = int8.products(every)
        layers = sorted({name.split("/")[0] for name in products})
        roles = sorted({name.split("/")[1] for name in products})
        cases: dict[str, Callable[[str], bool]] = {"every product int8": lambda name: False}
        cases.update({f"only {layer} int8": lambda n, x=layer: not n.startswith(x + "/") for layer in layers})
        cases.update({f"only {role} int8": lambda n, x=role: not n.endswith("/" + x) for role in roles})
        kept = int8.KEEP_FLOAT
        cases[f"--dtype int8 (fp32: {', '.join(kept) or 'none'})"] = lambda n: any(int8.matches(n, p) for p in kept)
        cases["no product int8 (LiteRT fp32)"] = lambda name: True
        rows = []
        for case, keep in cases.items():
            runner = lite.LiteRunner(int8.restore_float(every, keep, exact), encoder._threads())
            encoder._lite, encoder._quantized = runner, True  # every run on this model
            started = time.perf_counter()
            vectors = encoder.encode(texts)
            seconds = time.perf_counter() - started
            similarity = cosine_rows(vectors, base)
            row = {
                "case": case,
                "min": float(similarity.min()),
                "mean": float(similarity.mean()),
                "sentences_per_s": len(texts) / seconds,
            }
            log(f"{case}: min {row['min']:.4f} mean {row['mean']:.5f}, {row['sentences_per_s']:.0f}/s")
            rows.append(row)
    report = {
        "environment": environment(),
        "sentences": len(texts),
        "corpus": str(args.corpus),
        "rows": rows,
        "products": products,
    }
    write_report(report, markdown(report), args.json, args.markdown)
    return 0


def markdown(report: dict[str, Any]) -> str:
    fastest = statistics.median(row["sentences_per_s"] for row in report["rows"])
    lines = [
        "# int8 product by product (all-MiniLM-L6-v2 unless told)",
        "",
        f"{report['sentences']} sentences ({report['corpus']} and the reference sentences), against the fp32 "
        f"graph's vectors, on {describe_cpu(report['environment'])}. Speeds are one timed pass each (median "
        f"{fastest:.0f}/s): read them as a rough guide, the compare run times int8 properly.",
        "",
        "| case | min cosine | mean cosine | sentences/s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for row in report["rows"]:
        lines.append(f"| {row['case']} | {row['min']:.4f} | {row['mean']:.5f} | {row['sentences_per_s']:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
