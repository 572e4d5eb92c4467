"""The torch path of the export: sentence-transformers' own pipeline, traced into one graph.

For models :mod:`app.memory.search.onnx_build` does not write (an encoder other than BERT, max
pooling, weights only in ``pytorch_model.bin``). It needs torch and sentence-transformers, which
the default install leaves out (``pip install 'memproxy[export]'`` brings them); the graph is
kept only if it gives sentence-transformers' vectors on :data:`PROBES`.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from app.memory.search.onnx_cache import CannotExport
from app.memory.search.onnx_model import (
    MAX_TOKENS,
    PROBES,
    TOLERANCE,
    TRACER,
    module_kinds,
    run,
    tokenizer_for,
)


def trace(source: Path, output: Path) -> dict[str, Any]:
    """The whole sentence-transformers pipeline as one ONNX graph in `output`, with the manifest
    that goes with it; raises (and leaves nothing) unless it reproduces sentence-transformers."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only, whatever the caller set
    try:
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging
    except ImportError as exc:  # the default install: BERT models only (onnx_build)
        raise CannotExport(
            f"no ONNX export of {source} in {output.parent}, and this install cannot make one "
            f"({exc.name} is not installed; only BERT models in safetensors export without it): "
            "pip install 'memproxy[export]', or make it where that is installed: "
            f"MEMPROXY_EMBEDDING_CACHE_DIR={output.parent} memproxy model prepare",
            exc.name,
        ) from None

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # JSON logs
    model = SentenceTransformer(str(source), device="cpu", local_files_only=True).eval()
    kinds = [type(module).__name__ for module in model]
    if kinds != module_kinds(source):
        raise ValueError(f"{source}: sentence-transformers loads modules {kinds}, not supported")
    accepted = getattr(model.tokenizer, "model_input_names", None) or ["input_ids"]
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in accepted]

    class Pipeline(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: Any) -> Any:
            return self.model(dict(zip(names, inputs, strict=True)))["sentence_embedding"]

    sample = torch.ones((2, 8), dtype=torch.int64)
    samples = tuple(torch.zeros_like(sample) if n == "token_type_ids" else sample for n in names)
    axes = {0: "batch", 1: "tokens"}
    with warnings.catch_warnings():  # the tracer's notes on a graph checked against torch below
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Pipeline(), samples, str(output), input_names=names,
            output_names=["sentence_embedding"],
            dynamic_axes={**{n: axes for n in names}, "sentence_embedding": {0: "batch"}},
            opset_version=17, dynamo=False,
        )  # fmt: skip
    manifest: dict[str, Any] = {
        "exporter": TRACER,
        "modules": kinds,
        "max_tokens": int(model.max_seq_length or MAX_TOKENS),
        "dim": 0,
    }
    try:
        import onnxruntime as ort  # type: ignore[import-untyped]

        session = ort.InferenceSession(str(output), providers=["CPUExecutionProvider"])
        tokenizer = tokenizer_for(source / "tokenizer.json", manifest["max_tokens"])
        got = run(session, tokenizer, PROBES)
        with torch.no_grad():
            want = model.encode(list(PROBES), convert_to_numpy=True)
        difference = float(np.abs(got - want).max()) if got.shape == want.shape else np.inf
        if difference > TOLERANCE:
            raise ValueError(
                f"{source}: the ONNX export differs from sentence-transformers by {difference:.2g} "
                f"(more than {TOLERANCE}); not used"
            )
    except BaseException:
        output.unlink(missing_ok=True)
        raise
    manifest["dim"] = int(got.shape[1])
    manifest["max_difference"] = difference
    return manifest
