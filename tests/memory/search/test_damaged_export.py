"""A damaged ONNX export in the cache (a copy cut short: a full disk, a killed copy) is made again
once, with a WARNING, also without torch for the bundled model; where it cannot be (a model only
torch exports, in an install without it), `memproxy serve` says so in one line naming
`memproxy model prepare` and exits 2, never with a traceback. Copies of the session's exports
(`model_cache`) are damaged, never the shared ones."""

from __future__ import annotations

import gc
import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from app.memory.search.embedder import bundled_model_path, load_embedder
from app.memory.search.onnx_model import ModelFiles, logger, prepare
from tests.helpers import free_port, running


def _copies(
    model_cache: Path, into: Path, model: str | None = None
) -> tuple[ModelFiles, ModelFiles]:
    """The fp32 and int8 exports of `model` (the bundled one by default), copied into `into`
    (made first if need be)."""
    into.mkdir()
    copied = []
    for quantize in (False, True):
        files = prepare(model or bundled_model_path(), str(model_cache), quantize=quantize)
        for path in (files.onnx, files.manifest):
            shutil.copy2(path, into / path.name)
        copied.append(ModelFiles(into / files.onnx.name, files.tokenizer, files.name))
    return copied[0], copied[1]


def _cut(files: ModelFiles) -> int:
    """Cut the export to half its size; its size before."""
    size = files.onnx.stat().st_size
    with files.onnx.open("r+b") as f:
        f.truncate(size // 2)
    return size


@pytest.fixture
def warnings() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


async def test_a_truncated_export_is_made_again_when_loaded(
    model_cache: Path, tmp_path: Path, warnings: list[logging.LogRecord]
) -> None:
    """The int8 export cut short, with a manifest of before the size was recorded in it: the
    load finds it broken, quantises it again from the fp32 one, and embeds."""
    _fp32, int8 = _copies(model_cache, tmp_path / "models")
    manifest = json.loads(int8.manifest.read_text())
    manifest.pop("onnx_bytes", None)
    int8.manifest.write_text(json.dumps(manifest))
    size = _cut(int8)
    embedder = load_embedder(Settings(embedding_cache_dir=str(tmp_path / "models")))
    try:
        assert (await embedder.embed_query("where do I live?")).shape == (384,)
    finally:
        embedder.close()
    assert abs(int8.onnx.stat().st_size - size) < size // 100  # whole again
    (warning,) = [r.getMessage() for r in warnings]
    assert warning.startswith(f"the ONNX export {int8.onnx} is damaged (") and warning.endswith(
        "); making it again"
    )


def _max_pooled(tmp_path: Path) -> Path:
    """The bundled model with max pooling: a model only torch exports."""
    copy = tmp_path / "max-model"
    shutil.copytree(bundled_model_path(), copy)
    (copy / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, "pooling_mode_max_tokens": True})
    )
    return copy


def _without_torch(
    tmp_path: Path, *argv: str, model: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`memproxy argv...` where torch cannot be imported, on the exports in ``tmp_path/models``
    (of `model`, when given: MEMPROXY_EMBEDDING_MODEL)."""
    script = """
import sys
for name in ("torch", "transformers", "sentence_transformers"):
    sys.modules[name] = None  # importing any of them fails
from app.cli import main
sys.exit(main(sys.argv[1:]))
"""
    environ = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(Path.cwd()),
        "MEMPROXY_EMBEDDING_CACHE_DIR": str(tmp_path / "models"),
        "MEMPROXY_PORT": str(free_port()),
        "MEMPROXY_UPSTREAM_CHECK_AT_START": "false",
        **({"MEMPROXY_EMBEDDING_MODEL": str(model)} if model else {}),
    }
    return subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, cwd=tmp_path,
        env=environ, timeout=120, check=False,
    )  # fmt: skip


def test_without_torch_the_bundled_models_export_is_made_again(
    model_cache: Path, tmp_path: Path
) -> None:
    """The default install has no torch: a truncated export of the bundled model is written
    again from its weights, with the WARNING, and `model prepare` succeeds."""
    fp32, int8 = _copies(model_cache, tmp_path / "models")
    size = _cut(fp32)
    run = _without_torch(tmp_path, "model", "prepare")
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert f"the ONNX export {fp32.onnx} is damaged" in run.stderr
    assert abs(fp32.onnx.stat().st_size - size) < size // 100 and int8.onnx.exists()


def test_serve_without_torch_says_in_one_line_to_prepare_the_model(
    model_cache: Path, tmp_path: Path
) -> None:
    """A model only torch exports, in an install without it: its truncated fp32 export is one
    line and exit 2."""
    model = _max_pooled(tmp_path)
    fp32, _int8 = _copies(model_cache, tmp_path / "models", str(model))
    _cut(fp32)
    run = _without_torch(tmp_path, "serve", model=model)
    lines = [line for line in run.stderr.splitlines() if "WARNING" not in line]
    assert run.returncode == 2, run.stderr
    (line,) = lines
    assert line.startswith(f"memproxy: the ONNX export {fp32.onnx} is damaged and cannot be made ")
    assert f"MEMPROXY_EMBEDDING_CACHE_DIR={tmp_path / 'models'} memproxy model prepare" in line
    assert "Traceback" not in run.stderr


def test_other_commands_without_torch_end_on_the_same_line(
    model_cache: Path, tmp_path: Path
) -> None:
    model = _max_pooled(tmp_path)
    fp32, _int8 = _copies(model_cache, tmp_path / "models", str(model))
    _cut(fp32)
    run = _without_torch(tmp_path, "model", "prepare", model=model)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    line = run.stderr.splitlines()[-1]
    assert line.startswith(f"memproxy: the ONNX export {fp32.onnx} is damaged and cannot be made ")


async def test_serve_checks_and_loads_each_export_once(
    model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`memproxy serve` looks at the cached exports where its app loads the embedder, once each:
    no check before it that prepares them a second time."""
    import uvicorn

    from app import cli, main
    from app.memory.search import embedder

    for quantize in (False, True):  # both there: what a check would look at
        prepare(bundled_model_path(), str(model_cache), quantize=quantize)
    prepared: list[bool] = []

    def counted(*args: Any, quantize: bool) -> ModelFiles:
        prepared.append(quantize)
        return prepare(*args, quantize=quantize)

    monkeypatch.setattr(embedder, "prepare", counted)
    monkeypatch.setattr(gc, "freeze", lambda: None)  # this process is pytest's
    factories: list[str] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: factories.append(app))
    for name, value in (
        ("EMBEDDING_CACHE_DIR", str(model_cache)),
        ("MANAGER_ENABLED", "false"),
        ("UPSTREAM_CHECK_AT_START", "false"),
    ):
        monkeypatch.setenv(f"MEMPROXY_{name}", value)
    assert cli.main(["serve"]) == 0
    assert factories == ["app.main:create_served_app"]
    async with running(main.create_served_app()) as client:  # as uvicorn runs it
        assert (await client.get("/readyz")).status_code == 200
    assert sorted(prepared) == [False, True]
