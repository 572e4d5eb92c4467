"""The model's ONNX files: made once from the local sentence-transformers weights, then run.

Export (:func:`prepare`, at build or first start; torch and sentence-transformers are imported
only then): sentence-transformers' own pipeline, traced whole into one graph (Transformer,
Pooling, then any Dense and Normalize, as the model's modules.json lists them; any other module
is refused), kept only if it gives sentence-transformers' vectors on :data:`PROBES`. A JSON
manifest beside it (modules, max_tokens, dim) is all that running it reads of the model, so the
runtime (:func:`tokenizer_for`, :func:`run`) needs only onnxruntime and tokenizers. Files are
named by a hash of the model's files (:func:`_content_key`): a copy of the model elsewhere finds
the export, changed weights make another.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.memory.search import onnx_cache
from app.memory.search.onnx_cache import CannotExport, DamagedExport, damage, discard

logger = logging.getLogger("memproxy.embedder")

MAX_TOKENS = 256
"""Longer texts are truncated; a model's own max_seq_length (in the manifest) overrides this."""

EXPORTER = "memproxy-onnx-2"
"""Salts the export's cache key: changing how the graph is made changes every file name."""
PROBES = (
    "hello",
    "A longer probe sentence, with punctuation!",
    "数字 123 and émojis 🎉",
    " ".join(["a text longer than the model's token limit"] * 80),
)
"""Run through the export and sentence-transformers: any difference > :data:`TOLERANCE` and
the export is deleted (different lengths in one batch check padding; the last, truncation)."""
TOLERANCE = 1e-4


@dataclass(frozen=True, slots=True)
class ModelFiles:
    onnx: Path
    """The graph: token ids in, the model's sentence embedding out (pooling, Dense, Normalize
    inside)."""
    tokenizer: Path
    name: str
    """Identifies the vectors: stored with each memory, so a change means re-embedding."""

    @property
    def manifest(self) -> Path:
        """What the export says of itself (JSON: modules, max_tokens, dim), written beside it:
        the runtime reads this, not sentence-transformers' config files."""
        return self.onnx.with_suffix(".json")


def _module_kinds(source: Path) -> list[str]:
    """The class names of the model's modules.json (a plain transformer folder, without one,
    is what sentence-transformers makes of it: mean pooling); refuses any other pipeline."""
    spec = source / "modules.json"
    if not spec.exists():
        return ["Transformer", "Pooling"]
    kinds = [str(m["type"]).rsplit(".", 1)[-1] for m in json.loads(spec.read_text())]
    if kinds[:2] != ["Transformer", "Pooling"] or any(
        k not in ("Dense", "Normalize") for k in kinds[2:]
    ):
        raise ValueError(
            f"{source}: modules {kinds} are not supported: memproxy exports Transformer, "
            "Pooling, then any of Dense and Normalize (modules.json)"
        )
    return kinds


_KEYS: dict[tuple[object, ...], str] = {}


def _content_key(source: Path) -> str:
    """sha256 (16 hex digits) of the files the vectors depend on, by their names relative to the
    folder, and :data:`EXPORTER`: the same for a copy of the model anywhere, different when its
    weights, configs or tokenizer differ. Hashed once per process (~0.3 s for MiniLM)."""
    names = [
        "model.safetensors", "pytorch_model.bin", "config.json", "modules.json",
        "sentence_bert_config.json", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    spec = source / "modules.json"
    folders = [str(m["path"]) for m in json.loads(spec.read_text())] if spec.exists() else []
    files = [source / n for n in names if (source / n).is_file()]
    for folder in filter(None, folders):  # each module's own config and weights
        files += sorted(p for p in (source / folder).rglob("*") if p.is_file())
    stat = tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    if stat not in _KEYS:
        digest = hashlib.sha256(EXPORTER.encode())
        for path in files:
            digest.update(path.relative_to(source).as_posix().encode() + b"\0")
            with path.open("rb") as f:
                digest.update(hashlib.file_digest(f, "sha256").digest())
        _KEYS[stat] = digest.hexdigest()[:16]
    return _KEYS[stat]


def prepare(model_dir: str, cache_dir: str, *, quantize: bool) -> ModelFiles:
    """Export (once) the model in `model_dir` to ONNX under `cache_dir`; the files to load.

    The file is named by the model's content (:func:`_content_key`), so another copy of the
    same model (a venv elsewhere) finds the export made by the first. An export there but
    damaged (:func:`~app.memory.search.onnx_cache.damage`) is made again, once, with a WARNING;
    :class:`~app.memory.search.onnx_cache.DamagedExport` when this install cannot."""
    source = Path(model_dir)
    weights = any((source / n).exists() for n in ("model.safetensors", "pytorch_model.bin"))
    if not weights or not (source / "tokenizer.json").exists():
        raise FileNotFoundError(f"{model_dir} is not a local sentence-transformers model folder")
    _module_kinds(source)  # refused before anything is exported
    variant = "int8" if quantize else "fp32"
    target = Path(cache_dir) / f"{source.name}-{_content_key(source)}-{variant}.onnx"
    damaged = damage(target) if target.exists() else None
    if damaged is not None:
        logger.warning("the ONNX export %s is damaged (%s); making it again", target, damaged)
        discard(target)
    if not target.exists():
        if damaged is None:  # one line per export: fp32 for memories, int8 for queries
            logger.info("exporting %s to ONNX, %s (once): %s", source, variant, target)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            _export(source, target, quantize=quantize)
        except Exception as exc:
            if damaged is None:
                raise
            raise DamagedExport(
                f"the ONNX export {target} is damaged and cannot be made again here "
                f"({onnx_cache.why_not(exc)}); make it where memproxy is fully installed: "
                f"MEMPROXY_EMBEDDING_CACHE_DIR={cache_dir} memproxy model prepare"
            ) from None
        _remove_old_exports(target.parent, source.name)
    return ModelFiles(
        onnx=target, tokenizer=source / "tokenizer.json", name=f"{source.name}:{variant}"
    )


def _remove_old_exports(folder: Path, name: str) -> None:
    """Delete this model's exports made by memproxy before exports were named by content
    (``{name}-{12 hex digits of its path and size}-{fp32|int8}.onnx``, ~90 MB each), which
    nothing loads any more: both, whichever variant this start exported."""
    old = re.compile(rf"{re.escape(name)}-[0-9a-f]{{12}}-(?:fp32|int8)\.onnx")
    for path in folder.iterdir():
        if old.fullmatch(path.name):
            with contextlib.suppress(OSError):
                path.unlink()
                logger.info("removed an export of an earlier memproxy: %s", path)


def _export(source: Path, target: Path, *, quantize: bool) -> None:
    """Write `target` and its manifest. fp32 is traced from sentence-transformers (torch is
    imported only then) and checked against it; int8 is quantised from the fp32 export (made
    first if missing; when it is there, this needs only onnxruntime)."""
    plain = target.with_name(target.name.replace("-int8.onnx", "-fp32.onnx"))
    if quantize:
        if not plain.exists() or damage(plain) is not None:
            discard(plain)
            _export(source, plain, quantize=False)
        _quantize(plain, target)
        return
    onnx_cache.publish(target, _trace(source, target.with_suffix(".tmp")))


def _trace(source: Path, output: Path) -> dict[str, Any]:
    """The whole sentence-transformers pipeline as one ONNX graph in `output`, with the manifest
    that goes with it; raises (and leaves nothing) unless it reproduces sentence-transformers."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only, whatever the caller set
    try:
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging
    except ImportError as exc:  # a serving-only install (the Docker image's): no exporting there
        raise CannotExport(
            f"no ONNX export of {source} in {output.parent}, and this install cannot make one "
            f"({exc.name} is not installed); make it where memproxy is fully installed: "
            f"MEMPROXY_EMBEDDING_CACHE_DIR={output.parent} memproxy model prepare",
            exc.name,
        ) from None

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # JSON logs
    model = SentenceTransformer(str(source), device="cpu", local_files_only=True).eval()
    kinds = [type(module).__name__ for module in model]
    if kinds != _module_kinds(source):
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
        "exporter": EXPORTER,
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


def _quantize(plain: Path, target: Path) -> None:
    from onnxruntime.quantization import (  # type: ignore[import-untyped]
        QuantType,
        quantize_dynamic,
    )

    # It logs advice on the root logger (outside memproxy's format); nothing to act on.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_dynamic(str(plain), str(target.with_suffix(".tmp")), weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)
    manifest = json.loads(plain.with_suffix(".json").read_text())
    manifest.pop("max_difference", None)  # measured for fp32; int8 is meant to differ
    onnx_cache.publish(target, manifest)


def tokenizer_for(path: Path, max_tokens: int) -> Any:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_tokens)
    tokenizer.enable_padding()
    return tokenizer


def run(session: Any, tokenizer: Any, texts: Sequence[str]) -> np.ndarray:
    """The graph's output for `texts`, as it comes (normalised or not, as the model says)."""
    encodings = tokenizer.encode_batch(list(texts))
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    columns = {
        "input_ids": ids,
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.zeros_like(ids),
    }
    inputs = {i.name: columns[i.name] for i in session.get_inputs()}
    output: np.ndarray = session.run(None, inputs)[0]
    return output
