"""Whether an ONNX export in the cache is whole, before it is used.

An export is written to a temporary name and renamed, so it appears whole or not at all; but a
cache copied short (a full disk, a killed ``cp``, an image layer cut) holds a file onnxruntime
cannot parse, and the start would fail with its traceback. Each export's manifest records the
size it was written with (``onnx_bytes``): :func:`damage` compares it, which costs nothing. An
export made before the size was recorded is loaded once to check it, and its size recorded then.

:mod:`app.memory.search.onnx_model` makes a damaged export again, once, with a WARNING; where it
cannot (a model only torch exports, in an install without it), :class:`DamagedExport` says in
one line what to run.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from app.errors import first_line


class ModelUnavailable(Exception):
    """The embedding model cannot be loaded here; the message is one line saying what to do
    (`memproxy serve` and the CLI print it and exit 2)."""


class DamagedExport(ModelUnavailable):
    """A damaged export that could not be made again here; the message names
    ``memproxy model prepare``."""


class CannotExport(ModelUnavailable):
    """No export of a model only torch exports, and no torch or sentence-transformers here."""

    def __init__(self, message: str, missing: str | None) -> None:
        super().__init__(message)
        self.missing = missing


def why_not(exc: Exception) -> str:
    """Why an export failed, in a few words."""
    if isinstance(exc, CannotExport):
        return f"{exc.missing} is not installed"
    return f"{type(exc).__name__}: {first_line(exc)}"


def damage(target: Path) -> str | None:
    """What is wrong with the export `target` and its manifest, or None when they are usable."""
    manifest_path = target.with_suffix(".json")
    try:
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        int(manifest["dim"]), int(manifest["max_tokens"])
    except FileNotFoundError:
        return f"its manifest {manifest_path.name} is missing"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its manifest {manifest_path.name} cannot be read: {type(exc).__name__}"
    size = target.stat().st_size
    recorded = manifest.get("onnx_bytes")
    if recorded is not None:
        return None if size == recorded else f"{size} bytes, where {recorded} were written"
    try:  # made before sizes were recorded: loading it is the check
        import onnxruntime as ort  # type: ignore[import-untyped]

        ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own errors (InvalidProtobuf, Fail...)
        return f"onnxruntime cannot load it: {first_line(exc)}"
    manifest["onnx_bytes"] = size
    with contextlib.suppress(OSError):  # a read-only cache: checked again at the next start
        write_atomically(manifest_path, json.dumps(manifest, indent=1))
    return None


def discard(target: Path) -> None:
    """Remove the export `target` and its manifest (whichever are there)."""
    target.unlink(missing_ok=True)
    target.with_suffix(".json").unlink(missing_ok=True)


def publish(target: Path, manifest: dict[str, Any]) -> None:
    """Put the export written at `target`'s ``.tmp`` in place, with its manifest and the size
    :func:`damage` checks it against: the export appears whole or not at all."""
    written = target.with_suffix(".tmp")
    manifest["onnx_bytes"] = written.stat().st_size
    write_atomically(target.with_suffix(".json"), json.dumps(manifest, indent=1))
    written.rename(target)


def write_atomically(path: Path, text: str) -> None:
    path.with_suffix(".json.tmp").write_text(text)
    path.with_suffix(".json.tmp").rename(path)
