"""The model's ONNX files: made once from the local sentence-transformers weights, then run.

Export (:func:`prepare`, at build or first start): the model's whole pipeline as one graph
(Transformer, Pooling, then any Dense and Normalize, as the model's modules.json lists them; any
other module is refused). A BERT model in safetensors (the bundled all-MiniLM-L6-v2) is written
from its weights with numpy and onnx (:mod:`~app.memory.search.onnx_build`): no torch. Any other
is traced by torch (:mod:`~app.memory.search.onnx_trace`, the ``export`` extra) and kept only
if it gives sentence-transformers' vectors on :data:`PROBES`. A JSON manifest beside it
(modules, max_tokens, dim) is all that running it reads of the model, so the runtime
(:func:`tokenizer_for`, :func:`run`) needs only onnxruntime and tokenizers. Files are named by
a hash of the model's files (:func:`_content_key`): a copy of the model elsewhere finds the
export, changed weights make another.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.memory.search import onnx_build, onnx_cache
from app.memory.search.onnx_cache import DamagedExport, damage, discard

logger = logging.getLogger("memproxy.embedder")

MAX_TOKENS = 256
"""Longer texts are truncated; a model's own max_seq_length (in the manifest) overrides this."""

EXPORTER = "memproxy-onnx-3"
"""Salts the cache key of a graph written from the weights (:mod:`onnx_build`): changing how
it is made changes its file names."""
TRACER = "memproxy-onnx-2"
"""Salts the cache key of a traced graph: unchanged since torch traced every model, so an
export traced by an earlier memproxy is still found."""
PROBES = (
    "hello",
    "A longer probe sentence, with punctuation!",
    "数字 123 and émojis 🎉",
    " ".join(["a text longer than the model's token limit"] * 80),
)
"""Run through each new export (a traced one is compared with sentence-transformers: any
difference > :data:`TOLERANCE` and it is deleted); different lengths in one batch check
padding, the last truncation."""
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


def module_kinds(source: Path) -> list[str]:
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


def exporter_of(source: Path) -> str:
    """Which way `source` is exported: :data:`EXPORTER` (from its weights) or :data:`TRACER`."""
    return EXPORTER if onnx_build.supports(source) else TRACER


def _content_key(source: Path, salt: str | None = None) -> str:
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
    salt = salt or exporter_of(source)
    stat = (salt, *((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    if stat not in _KEYS:
        digest = hashlib.sha256(salt.encode())
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
    module_kinds(source)  # refused before anything is exported
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
                f"({onnx_cache.why_not(exc)}); make it where memproxy[export] is installed: "
                f"MEMPROXY_EMBEDDING_CACHE_DIR={cache_dir} memproxy model prepare"
            ) from None
        _remove_old_exports(target.parent, source)
    return ModelFiles(
        onnx=target, tokenizer=source / "tokenizer.json", name=f"{source.name}:{variant}"
    )


def _remove_old_exports(folder: Path, source: Path) -> None:
    """Delete exports of this model that nothing here loads any more (~90 MB each): those made
    before exports were named by content (``{name}-{12 hex digits}-{fp32|int8}.onnx``), and,
    once it is written from its weights, the export an earlier memproxy traced of this same
    model (an earlier memproxy sharing the folder makes it again). Other models' and other
    copies' exports are left alone."""
    old = re.compile(rf"{re.escape(source.name)}-[0-9a-f]{{12}}-(?:fp32|int8)\.onnx")
    traced = (
        {f"{source.name}-{_content_key(source, TRACER)}-{v}.onnx" for v in ("fp32", "int8")}
        if exporter_of(source) == EXPORTER
        else set()
    )
    for path in folder.iterdir():
        if old.fullmatch(path.name) or path.name in traced:
            with contextlib.suppress(OSError):
                discard(path)
                logger.info("removed an export of an earlier memproxy: %s", path)


def _export(source: Path, target: Path, *, quantize: bool) -> None:
    """Write `target` and its manifest. fp32 is written from the weights (BERT) or traced
    (others; torch is imported only then); int8 is quantised from the fp32 export (made first
    if missing)."""
    plain = target.with_name(target.name.replace("-int8.onnx", "-fp32.onnx"))
    if quantize:
        if not plain.exists() or damage(plain) is not None:
            discard(plain)
            _export(source, plain, quantize=False)
        _quantize(plain, target)
        return
    if onnx_build.supports(source):
        manifest = _build(source, target.with_suffix(".tmp"))
    else:
        from app.memory.search.onnx_trace import trace  # torch: only for other models

        manifest = trace(source, target.with_suffix(".tmp"))
    onnx_cache.publish(target, manifest)


def _build(source: Path, output: Path) -> dict[str, Any]:
    """The graph written from `source`'s weights into `output`, and its manifest; raises (and
    leaves nothing) unless onnxruntime runs it to finite vectors."""
    try:
        kinds = onnx_build.build(source, output)
        import onnxruntime as ort  # type: ignore[import-untyped]

        max_tokens = onnx_build.max_tokens(source, MAX_TOKENS)
        session = ort.InferenceSession(str(output), providers=["CPUExecutionProvider"])
        got = run(session, tokenizer_for(source / "tokenizer.json", max_tokens), PROBES)
        if got.ndim != 2 or not np.isfinite(got).all():
            raise ValueError(f"{source}: the ONNX graph written from its weights gives no vectors")
    except BaseException:
        output.unlink(missing_ok=True)
        raise
    return {"exporter": EXPORTER, "modules": kinds, "max_tokens": max_tokens, "dim": got.shape[1]}


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
