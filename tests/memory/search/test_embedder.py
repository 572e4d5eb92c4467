"""The embedder, with the real bundled model (exported to ONNX once per test session)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.memory.search.embedder import Embedder, bundled_model_path, prepare

TEXTS = [
    "When did Caroline go to the LGBTQ support group?",
    "I moved to Oslo last spring with my two kids.",
    "[8 May, 2023] Melanie: I painted a lake sunrise last year!",
    "My favourite food is sushi but I hate wasabi.",
]


@pytest.fixture(scope="module")
def embedder(model_cache: Path) -> Iterator[Embedder]:
    instance = Embedder(prepare(bundled_model_path(), str(model_cache), quantize=False))
    yield instance
    instance.close()


def test_vectors_equal_sentence_transformers(embedder: Embedder) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(bundled_model_path(), device="cpu").encode(
        TEXTS, normalize_embeddings=True
    )
    vectors = embedder.encode(TEXTS)
    assert vectors.shape == (4, 384) and vectors.dtype == np.float32 and embedder.dim == 384
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert float((vectors * reference).sum(axis=1).min()) > 0.9999
    # and the similarities mean something: a question is nearer its own topic
    assert (
        vectors[0] @ vectors[1]
        < vectors[1] @ embedder.encode(["We relocated to Norway's capital."])[0]
    )


async def test_concurrent_callers_share_batches_and_repeats_are_cached(embedder: Embedder) -> None:
    before = embedder.batches
    results = await asyncio.gather(*(embedder.embed([f"question number {i}"]) for i in range(12)))
    assert all(r.shape == (1, 384) for r in results)
    assert embedder.batches - before < 12  # joined into fewer model runs
    single = embedder.encode(["question number 3"])
    assert np.allclose(results[3], single, atol=1e-6)
    before = embedder.batches
    again = await embedder.embed(["question number 3", "question number 5"])
    assert embedder.batches == before and np.allclose(again[0], results[3][0])
    assert (await embedder.embed([])).shape == (0, 384)


def test_export_is_reused_and_bad_folders_are_refused(model_cache: Path, tmp_path: Path) -> None:
    files = prepare(bundled_model_path(), str(model_cache), quantize=False)
    stamp = files.onnx.stat().st_mtime_ns
    assert prepare(bundled_model_path(), str(model_cache), quantize=False) == files
    assert files.onnx.stat().st_mtime_ns == stamp
    assert files.name.endswith(":fp32")
    with pytest.raises(FileNotFoundError):
        prepare(str(tmp_path), str(model_cache), quantize=False)


def test_pooling_comes_from_the_models_own_config(tmp_path: Path) -> None:
    import json
    import shutil

    from app.memory.search.embedder import _pooling

    bundled = Path(bundled_model_path())
    assert _pooling(bundled) == "mean"
    assert _pooling(tmp_path) == "mean"  # a plain transformer folder
    (tmp_path / "1_Pooling").mkdir()
    config = tmp_path / "1_Pooling" / "config.json"
    config.write_text(
        json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    assert _pooling(tmp_path) == "cls"
    config.write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match="not supported"):
        _pooling(tmp_path)
    # and a CLS model's vectors are its first token's, as sentence-transformers computes them
    copy = tmp_path / "cls-model"
    shutil.copytree(bundled, copy)
    (copy / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, "pooling_mode_cls_token": True})
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(copy), device="cpu").encode(
        TEXTS, normalize_embeddings=True
    )
    cls = Embedder(prepare(str(copy), str(tmp_path / "exports"), quantize=False))
    assert float((cls.encode(TEXTS) * reference).sum(axis=1).min()) > 0.9999
    cls.close()
