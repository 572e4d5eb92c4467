"""The embedder, with the real bundled model (exported to ONNX once per test session)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from app.memory.search.embedder import INLINE_CHARS, Embedder, bundled_model_path
from app.memory.search.onnx_model import _content_key, prepare

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


def _sentence_transformer(path: Path | str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu")


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled model with a Dense layer (384 -> 128, tanh) after its pooling: what the
    BERT-only exporter silently got wrong (384-dim vectors without the layer)."""
    import torch
    from sentence_transformers import SentenceTransformer, models

    torch.manual_seed(0)
    bundled = _sentence_transformer(bundled_model_path())
    dense = models.Dense(in_features=384, out_features=128, activation_function=torch.nn.Tanh())
    folder = tmp_path_factory.mktemp("dense") / "dense-model"
    modules = [bundled[0], bundled[1], dense, models.Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def test_a_dense_layer_is_part_of_the_export(dense_model: Path, model_cache: Path) -> None:
    reference = _sentence_transformer(dense_model).encode(TEXTS)
    assert reference.shape == (4, 128)
    for quantize in (False, True):
        files = prepare(str(dense_model), str(model_cache), quantize=quantize)
        manifest = json.loads(files.manifest.read_text())
        assert manifest["modules"] == ["Transformer", "Pooling", "Dense", "Normalize"]
        assert manifest["dim"] == 128 and manifest["max_tokens"] == 256
        embedder = Embedder(files)
        vectors = embedder.encode(TEXTS)
        embedder.close()
        assert embedder.dim == 128 and vectors.shape == (4, 128)
        if quantize:  # int8, from the fp32 export: near, not equal
            assert float((vectors * reference).sum(axis=1).min()) > 0.8
        else:
            assert float(np.abs(vectors - reference).max()) < 1e-5


def test_cls_pooling_gives_sentence_transformers_vectors(tmp_path: Path) -> None:
    copy = tmp_path / "cls-model"
    shutil.copytree(bundled_model_path(), copy)
    (copy / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, "pooling_mode_cls_token": True})
    )
    reference = _sentence_transformer(copy).encode(TEXTS, normalize_embeddings=True)
    cls = Embedder(prepare(str(copy), str(tmp_path / "exports"), quantize=False))
    assert float(np.abs(cls.encode(TEXTS) - reference).max()) < 1e-5
    cls.close()


def test_unsupported_modules_are_refused_before_any_export(tmp_path: Path) -> None:
    model = tmp_path / "odd-model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"")
    (model / "tokenizer.json").write_text("{}")
    base = "sentence_transformers.models."
    for kinds in (
        ["Transformer", "Pooling", "LayerNorm", "Normalize"],
        ["Transformer", "Normalize"],  # no pooling: token vectors, not a sentence's
        ["CLIPModel"],
    ):
        spec = [
            {"idx": i, "name": str(i), "path": "", "type": base + k} for i, k in enumerate(kinds)
        ]
        (model / "modules.json").write_text(json.dumps(spec))
        with pytest.raises(
            ValueError, match=r"modules \[.*\] are not supported.*Transformer, Pooling"
        ):
            prepare(str(model), str(tmp_path / "exports"), quantize=False)
    assert not (tmp_path / "exports").exists()


def test_the_export_is_named_by_the_models_content(
    embedder: Embedder, model_cache: Path, tmp_path: Path, dense_model: Path
) -> None:
    """A venv at another path (the same model, copied) finds the export made by the first, even
    in a process without torch; changed weights (the transformer's or a module's) make another."""
    bundled = Path(bundled_model_path())
    copy = tmp_path / "elsewhere" / bundled.name
    shutil.copytree(bundled, copy)
    exported = prepare(str(bundled), str(model_cache), quantize=False)
    assert _content_key(copy) == _content_key(bundled)
    assert prepare(str(copy), str(model_cache), quantize=False).onnx == exported.onnx
    script = f"""
import sys
for name in ("torch", "transformers", "sentence_transformers"):
    sys.modules[name] = None  # importing any of them fails
from app.memory.search.embedder import Embedder
from app.memory.search.onnx_model import prepare
files = prepare({str(copy)!r}, {str(model_cache)!r}, quantize=False)
assert files.onnx.name == {exported.onnx.name!r}, files.onnx
print(Embedder(files).dim)
"""
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=Path.cwd(), check=False
    )
    assert (run.returncode, run.stdout.strip()) == (0, "384"), run.stderr
    weights = copy / "model.safetensors"
    with weights.open("r+b") as f:  # one weight changed, the file's size and name the same
        f.seek(-4, os.SEEK_END)
        f.write(bytes(4))
    assert _content_key(copy) != _content_key(bundled)
    dense_copy = tmp_path / dense_model.name
    shutil.copytree(dense_model, dense_copy)
    assert _content_key(dense_copy) == _content_key(dense_model)
    with (dense_copy / "2_Dense" / "model.safetensors").open("r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(bytes(4))
    assert _content_key(dense_copy) != _content_key(dense_model)


def _nice_by_thread() -> dict[str, int]:
    """This process's threads, by id: each one's nice value (Linux keeps one per thread)."""
    nice = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                nice[tid] = int(stat.read().rsplit(")", 1)[1].split()[16])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread (an earlier test's pool worker) ended between listing and reading
    return nice


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads Linux's /proc")
@pytest.mark.parametrize("quantize", ["queries", "none"])
def test_memories_are_embedded_on_several_threads_below_chats_a_query_on_one_of_its_own(
    model_cache: Path, quantize: Literal["queries", "none"]
) -> None:
    from app.config import Settings
    from app.memory.search.embedder import PairedEmbedder, load_embedder

    before = _nice_by_thread()
    settings = Settings(
        embedding_cache_dir=str(model_cache), embedding_quantize=quantize, embedding_threads=3
    )
    loaded = load_embedder(settings)
    try:
        assert isinstance(loaded, PairedEmbedder)  # a query never waits behind an import
        documents, queries = loaded._documents, loaded._queries
        options = documents._session.get_session_options()
        assert options.intra_op_num_threads == 3
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert queries._session.get_session_options().intra_op_num_threads == 1
        assert (documents.model_name == queries.model_name) == (quantize == "none")
        started = {t: n for t, n in _nice_by_thread().items() if t not in before}
        # The memories' thread and the two more onnxruntime starts for its session, all below
        # chats; the query's thread at the server's priority.
        assert sorted(started.values()).count(10) == 3
        query_thread = str(queries._executor.submit(threading.get_native_id).result())
        assert _nice_by_thread()[query_thread] == 0
        # A chat's query is embedded on the event loop's thread (no hand-off), a memory on the
        # memories' thread; both as the model's thread would make them.
        ran: dict[str, int] = {}
        for name, embedder in (("documents", documents), ("queries", queries)):
            encode = embedder.encode

            def recorded(texts: Any, name: str = name, encode: Any = encode) -> Any:
                ran[name] = threading.get_native_id()
                for text in texts:
                    ran[text] = ran[name]
                return encode(texts)

            embedder.encode = recorded  # type: ignore[method-assign]

        long = "a long question " * (INLINE_CHARS // 16 + 1)
        chinese = "我" * 60  # 60 characters, but a token each: over the limit

        async def both() -> tuple[Any, Any]:
            return await loaded.embed_query("a query"), await loaded.embed(["a memory"])

        query, memory = asyncio.run(both())
        assert ran["queries"] == threading.get_native_id() != ran["documents"]
        assert np.allclose(query, queries._executor.submit(queries.encode, ["a query"]).result()[0])
        assert queries.batches == 3 and query.shape == memory[0].shape  # probe, twice "a query"
        for text in (long, chinese):  # too long to hold the loop: the model's thread
            ran.clear()
            asyncio.run(loaded.embed_query(text))
            assert ran["queries"] == int(query_thread)
        hits, expected = queries.cache_hits, query.copy()
        again = asyncio.run(loaded.embed_query("a query"))  # from the cache, counted, a copy
        assert queries.cache_hits == hits + 1 and np.array_equal(again, expected)
        assert not np.shares_memory(again, queries._cache["a query"])
        again[:] = 0
        assert np.array_equal(asyncio.run(loaded.embed_query("a query")), expected)

        async def busy() -> None:  # a batch on the model's thread: the query waits its turn
            ran.clear()
            batch = asyncio.ensure_future(queries.embed(["a batch of one"]))
            await asyncio.sleep(0)
            await loaded.embed_query("another query")
            await batch

        asyncio.run(busy())
        assert ran["another query"] == ran["a batch of one"] == int(query_thread)
    finally:
        loaded.close()


def test_the_default_threads_are_the_cores_the_process_may_use(model_cache: Path) -> None:
    from app.config import Settings
    from app.memory.search.cores import usable_cores
    from app.memory.search.embedder import PairedEmbedder, load_embedder

    loaded = load_embedder(Settings(embedding_cache_dir=str(model_cache)))
    try:
        assert isinstance(loaded, PairedEmbedder)
        threads = loaded._documents._session.get_session_options().intra_op_num_threads
        assert threads == usable_cores()
    finally:
        loaded.close()


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "150000 100000\n"}, 2),  # cgroup v2: a container's --cpus 1.5
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),  # v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu.max": "garbage"}, None),
        ({}, None),
    ],
)
def test_a_containers_cpu_limit_bounds_the_threads(
    tmp_path: Path, files: dict[str, str], expected: int | None
) -> None:
    """More threads than the quota allows use it up early in each period, and then the whole
    process waits: the event loop too."""
    from app.memory.search.cores import MAX_AUTO_THREADS, cgroup_cpus, usable_cores

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpus(tmp_path) == expected
    cores = min(len(os.sched_getaffinity(0)), MAX_AUTO_THREADS)
    assert usable_cores(tmp_path) == min(cores, expected or cores)
