"""Build ``benchmarks/data/corpus.txt``: real English sentences from the stdlib docstrings.

The source is the prose that ships with Python itself: the docstrings of the standard
library's pure-Python modules, read with ``ast`` from the source files (nothing is imported,
so no module runs any code). Each docstring is split into paragraphs and sentences; a
sentence is kept when it looks like prose (4 to 60 words, starts with a capital letter, ends
with ``.``, ``!`` or ``?``, no code-ish characters). The kept sentences are deduplicated,
sorted and sampled with a fixed seed, so the same Python version gives the same file.

    python benchmarks/make_corpus.py                 # writes benchmarks/data/corpus.txt
    python benchmarks/make_corpus.py --count 2500 --seed 0 --out PATH
    python benchmarks/make_corpus.py --min-words 10 --out benchmarks/data/corpus-long.txt   # mean 23 tokens
"""

from __future__ import annotations

import argparse
import ast
import random
import re
import statistics
import sys
import sysconfig
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "corpus.txt"

# Parts of the stdlib that hold test code, demos or Python 2 sources rather than documentation.
SKIPPED_PARTS = frozenset(
    {"test", "tests", "idle_test", "idlelib", "lib2to3", "turtledemo", "site-packages", "__pycache__"}
)
# Modules that are not prose documentation (or are jokes).
SKIPPED_MODULES = frozenset({"antigravity", "this", "__hello__", "__phello__"})

MIN_WORDS = 4
MAX_WORDS = 60

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(]?[A-Z])")
CODE_CHARS = re.compile(r"[{}\[\]<>=_`|\\#@$~^*%/]|>>>|\(\)|\.\.|::")
DOTTED_NAME = re.compile(r"\w\.\w")  # os.path, e.g., 3.11: code-ish or a bad split
PROSE_START = re.compile(r"^[A-Z][a-z']*\b")
PROSE_END = re.compile(r"[a-z0-9)'\"][.!?]$")
SHOUTING = re.compile(r"\b[A-Z]{2,}[a-z]*\b.*\b[A-Z]{2,}\b")  # several ALLCAPS words: a constant list


def stdlib_sources(stdlib_dir: Path) -> list[Path]:
    """Return the ``.py`` files of the stdlib modules named in ``sys.stdlib_module_names``, sorted."""
    names = sorted(set(sys.stdlib_module_names) - SKIPPED_MODULES)
    files: set[Path] = set()
    for name in names:
        single = stdlib_dir / f"{name}.py"
        package = stdlib_dir / name
        if single.is_file():
            files.add(single)
        elif (package / "__init__.py").is_file():
            files.update(
                path
                for path in package.rglob("*.py")
                if not SKIPPED_PARTS.intersection(path.relative_to(stdlib_dir).parts)
            )
    return sorted(files)


def docstrings(path: Path) -> Iterator[str]:
    """Yield the module, class and function docstrings of one source file."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                yield doc


def prose_paragraphs(doc: str) -> Iterator[str]:
    """Yield the paragraphs of a docstring that are flowing text, joined onto one line.

    A paragraph with an indented line is a code sample, an argument list or a table: skipped.
    """
    for block in re.split(r"\n\s*\n", doc):
        lines = block.splitlines()
        if not lines or any(line[:1].isspace() for line in lines):
            continue
        yield " ".join(line.strip() for line in lines)


def split_sentences(paragraph: str) -> list[str]:
    """Split one paragraph into sentences at ``.``, ``!`` or ``?`` followed by a capital.

    Runs of whitespace inside a sentence become one space.
    """
    return [" ".join(part.split()) for part in SENTENCE_END.split(paragraph) if part.strip()]


def is_prose(sentence: str, min_words: int = MIN_WORDS) -> bool:
    """True when a sentence looks like English prose rather than code or a fragment."""
    n_words = len(sentence.split())
    return (
        min_words <= n_words <= MAX_WORDS
        and sentence.isascii()
        and PROSE_START.match(sentence) is not None
        and PROSE_END.search(sentence) is not None
        and CODE_CHARS.search(sentence) is None
        and DOTTED_NAME.search(sentence) is None
        and SHOUTING.search(sentence) is None
        and sentence.count("(") == sentence.count(")")
        and sentence.count('"') % 2 == 0
    )


def collect_sentences(files: Iterable[Path], min_words: int = MIN_WORDS) -> list[str]:
    """Return the distinct prose sentences of all docstrings in ``files``, sorted."""
    seen: set[str] = set()
    for path in files:
        for doc in docstrings(path):
            for paragraph in prose_paragraphs(doc):
                seen.update(s for s in split_sentences(paragraph) if is_prose(s, min_words))
    return sorted(seen)


def sample(sentences: list[str], count: int, seed: int) -> list[str]:
    """Pick ``count`` sentences (all of them if fewer) in a seeded random order."""
    rng = random.Random(seed)
    return rng.sample(sentences, min(count, len(sentences)))


def length_summary(sentences: list[str]) -> str:
    """One line of word-count statistics."""
    counts = [len(s.split()) for s in sentences]
    return (
        f"{len(sentences)} sentences; words per sentence: min {min(counts)}, "
        f"mean {statistics.mean(counts):.1f}, median {statistics.median(counts):g}, max {max(counts)}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output file (default: %(default)s)")
    parser.add_argument("--count", type=int, default=2500, help="sentences to keep (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    parser.add_argument(
        "--min-words", type=int, default=MIN_WORDS, help="shortest sentence kept, in words (default: %(default)s)"
    )
    parser.add_argument(
        "--stdlib-dir",
        type=Path,
        default=Path(sysconfig.get_paths()["stdlib"]),
        help="standard library source directory (default: this interpreter's)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    files = stdlib_sources(args.stdlib_dir)
    candidates = collect_sentences(files, args.min_words)
    corpus = sample(candidates, args.count, args.seed)
    if not corpus:
        print(f"no sentences found under {args.stdlib_dir}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(f"{s}\n" for s in corpus), encoding="utf-8")
    print(f"{len(files)} source files, {len(candidates)} distinct prose sentences")
    print(f"wrote {args.out}: {length_summary(corpus)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
