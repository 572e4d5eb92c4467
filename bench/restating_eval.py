"""What goes with a fact when it is forgotten: the rule of ``app/memory/search/restating.py``
measured on realistic pairs with the real bundled embedder (fp32, as memories are embedded).

Each line of ``bench/restating_pairs.txt`` is ``same|other | fact | memory``: a fact as the
Manager writes it, and a memory (a fact, or the user's own words) that must go with it when it
is forgotten (``same``) or stay (``other``). For each pair: the cosine of the whole memory with
the fact, and the best cosine of a sentence of it that passes the words' check
(:func:`~app.memory.search.restating.says`). Printed: how many of each kind go at a few
thresholds, the pairs the rule gets wrong at :data:`~app.memory.search.restating.SAME_AT`, and
how cosine alone would do (the best threshold on the whole memory's cosine).

    python bench/restating_eval.py            # the bundled model, exported under data/models
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.memory.search.embedder import Embedder, bundled_model_path
from app.memory.search.lexical import Analyzer
from app.memory.search.onnx_model import prepare
from app.memory.search.restating import SAME_AT, says, sentences

PAIRS = Path(__file__).with_name("restating_pairs.txt")
Row = tuple[str, str, str, float, float | None]


async def measure(embedder: Embedder, pairs: list[list[str]]) -> list[Row]:
    analyzer = Analyzer()
    rows: list[Row] = []
    for want, fact, memory in pairs:
        vectors = await embedder.embed([fact, memory, *sentences(memory)])
        cosines = (vectors[1:] @ vectors[0]).tolist()
        passing = [c for s, c in zip(sentences(memory), cosines[1:], strict=True)
                   if says(fact, s, analyzer)]  # fmt: skip
        rows.append((want, fact, memory, cosines[0], max(passing, default=None)))
    return rows


def report(rows: list[Row]) -> None:
    same = [r for r in rows if r[0] == "same"]
    other = [r for r in rows if r[0] == "other"]
    print(f"{len(rows)} pairs: {len(same)} must go, {len(other)} must stay")
    for at in (0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7):
        gone = sum(1 for r in same if r[4] is not None and r[4] >= at)
        wrong = sum(1 for r in other if r[4] is not None and r[4] >= at)
        print(f"  at {at:.2f}: {gone}/{len(same)} that must go go, {wrong}/{len(other)} that "
              "must stay go")  # fmt: skip
    print(f"wrong at SAME_AT = {SAME_AT}:")
    for want, fact, memory, whole, best in rows:
        goes = best is not None and best >= SAME_AT
        if goes != (want == "same"):
            said = f"{best:.2f}" if best is not None else "words fail"
            print(f"  {want:5} {fact!r} / {memory!r}: whole {whole:.2f}, sentence {said}")
    best_at = max(
        (sum(r[3] >= t for r in same) - sum(r[3] >= t for r in other), t)
        for t in sorted({round(r[3], 3) for r in rows})
    )[1]
    print(f"cosine alone, at its best threshold {best_at:.3f}: "
          f"{sum(r[3] >= best_at for r in same)}/{len(same)} go, "
          f"{sum(r[3] >= best_at for r in other)}/{len(other)} that must stay go")  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default="data/models", help="where the ONNX export goes")
    args = parser.parse_args()
    pairs = [
        [part.strip() for part in line.split(" | ")]
        for line in PAIRS.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    embedder = Embedder(prepare(bundled_model_path(), args.cache, quantize=False))
    try:
        report(await measure(embedder, pairs))
    finally:
        embedder.close()


if __name__ == "__main__":
    asyncio.run(main())
