"""The ONNX export written from the weights (no torch) against sentence-transformers' vectors
and against the torch-traced export it replaced, on the dev LoCoMo turns.

Prints, for fp32 and int8 (queries), the lowest and mean cosine of each turn's vector to
sentence-transformers' (the reference) and to the traced export's same variant, and the time to
make each export. Needs the dev install (torch, sentence-transformers).

    python bench/export_parity.py                      # the dev file's turns
    python bench/export_parity.py --data other.json --limit 500
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.memory.search import onnx_build  # noqa: E402
from app.memory.search.embedder import bundled_model_path  # noqa: E402
from app.memory.search.onnx_model import _quantize, run, tokenizer_for  # noqa: E402
from app.memory.search.onnx_trace import trace  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo_dev.json"


def turns(path: Path) -> list[str]:
    """Every dialog turn's text, in the format bench/recall_eval.py imports them."""
    texts = []
    for conversation in json.loads(path.read_text()):
        sessions = conversation["conversation"]
        for key, value in sessions.items():
            if key.startswith("session_") and isinstance(value, list):
                date = sessions.get(f"{key}_date_time", "")
                for turn in value:
                    caption = (
                        f" (shares photo: {turn['blip_caption']})" if "blip_caption" in turn else ""
                    )
                    texts.append(f"[{date}] {turn['speaker']}: {turn['text']}{caption}")
    return texts


def vectors(path: Path, source: Path, texts: list[str]) -> Any:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    tokenizer = tokenizer_for(source / "tokenizer.json", 256)
    return np.concatenate(
        [run(session, tokenizer, texts[i : i + 32]) for i in range(0, len(texts), 32)]
    )


def cosine(a: Any, b: Any) -> Any:
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--limit", type=int, default=0, help="the first N turns (0: all)")
    args = parser.parse_args()
    texts = turns(args.data)[: args.limit or None]
    source = Path(bundled_model_path())
    folder = Path(tempfile.mkdtemp(prefix="export-parity-"))
    made = {}
    for name, make in (("built", onnx_build.build), ("traced", trace)):
        start = time.perf_counter()
        output = folder / f"{name}-fp32.onnx"
        make(source, output.with_suffix(".tmp"))
        output.with_suffix(".tmp").rename(output)
        output.with_suffix(".json").write_text(json.dumps({"dim": 384, "max_tokens": 256}))
        made[name] = time.perf_counter() - start
        _quantize(output, folder / f"{name}-int8.onnx")
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(source), device="cpu").encode(texts, batch_size=32)
    print(f"{len(texts)} turns of {args.data.name}; export made in {made['built']:.1f} s "
          f"(built from the weights) and {made['traced']:.1f} s (traced by torch)")  # fmt: skip
    print("| variant | vs sentence-transformers: min / mean | vs the traced export: min / mean |")
    print("|---|---|---|")
    for variant in ("fp32", "int8"):
        built = vectors(folder / f"built-{variant}.onnx", source, texts)
        traced = vectors(folder / f"traced-{variant}.onnx", source, texts)
        to_reference, to_traced = cosine(built, reference), cosine(built, traced)
        print(f"| {variant} | {to_reference.min():.7f} / {to_reference.mean():.7f} "
              f"| {to_traced.min():.7f} / {to_traced.mean():.7f} |")  # fmt: skip


if __name__ == "__main__":
    main()
