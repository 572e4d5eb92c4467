"""A BERT sentence-transformers model as one ONNX graph, written from its weights without torch.

sentence-transformers' pipeline for a BERT encoder (all-MiniLM-L6-v2, bge, e5...) is a few
dozen matrix products: the embeddings, each layer's self-attention and feed-forward, then the
Pooling, Dense and Normalize modules its ``modules.json`` lists. :func:`build` writes that as an
opset-17 graph with :mod:`onnx`'s helpers, reading the weights with :mod:`safetensors` (numpy),
so exporting needs neither torch nor sentence-transformers: the default install stays small.
Each operation follows what ``transformers.BertModel`` computes in evaluation (exact GELU, the
attention mask as a large negative bias); the suite checks the vectors against
sentence-transformers' own (tests/memory/search/test_onnx_build.py).

:func:`supports` says whether a folder is such a model; others are traced with torch
(:mod:`app.memory.search.onnx_model`), where sentence-transformers is installed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.memory.search.onnx_graph import DENSE_ACTIVATIONS, BertGraph

POOLINGS = ("pooling_mode_mean_tokens", "pooling_mode_cls_token")


def supports(source: Path) -> bool:
    """Whether `source` is a BERT model in safetensors whose pooling and Dense modules
    :func:`build` writes (mean or CLS pooling; Dense weights in safetensors too)."""
    try:
        config = json.loads((source / "config.json").read_text())
        if config.get("model_type") != "bert" or config.get("hidden_act", "gelu") != "gelu":
            return False
        if config.get("position_embedding_type", "absolute") != "absolute":
            return False
        if not (source / "model.safetensors").is_file():
            return False
        modules = _modules(source)
    except (OSError, ValueError, KeyError):
        return False
    pooling = _pooling(source, modules[1]) if len(modules) > 1 else {}
    chosen = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v]
    if len(chosen) != 1 or chosen[0] not in POOLINGS:
        return False
    for module in modules[2:]:
        if _kind(module) == "Dense":
            folder = source / module["path"]
            activation = _read_json(folder / "config.json").get("activation_function", "")
            if activation.rsplit(".", 1)[-1] not in DENSE_ACTIVATIONS:
                return False
            if not (folder / "model.safetensors").is_file():
                return False
    return True


def build(source: Path, output: Path) -> list[str]:
    """Write `source`'s sentence embedding graph to `output` (inputs ``input_ids``,
    ``attention_mask``, ``token_type_ids``; output ``sentence_embedding``); the module kinds."""
    import onnx
    from safetensors.numpy import load_file

    config = json.loads((source / "config.json").read_text())
    weights = {_plain(k): v for k, v in load_file(str(source / "model.safetensors")).items()}
    graph = BertGraph(weights)
    hidden = graph.embeddings(config)
    for layer in range(int(config["num_hidden_layers"])):
        hidden = graph.layer(hidden, f"encoder.layer.{layer}", config)
    modules = _modules(source)
    pooling = _pooling(source, modules[1])
    embedding = graph.cls(hidden) if pooling.get("pooling_mode_cls_token") else graph.mean(hidden)
    for module in modules[2:]:
        if _kind(module) == "Dense":
            embedding = graph.dense(embedding, source / module["path"])
        else:
            embedding = graph.normalize(embedding)
    model = graph.model(embedding, onnx)
    onnx.save(model, str(output))
    return [_kind(m) for m in modules]


def max_tokens(source: Path, default: int) -> int:
    """The longest input sentence-transformers gives the model: ``max_seq_length`` of its
    sentence_bert_config.json, else `default`, never past its position embeddings."""
    config = json.loads((source / "config.json").read_text())
    limit = int(config.get("max_position_embeddings", default))
    sbert = source / "sentence_bert_config.json"
    length = json.loads(sbert.read_text()).get("max_seq_length") if sbert.is_file() else None
    if length is None and not (source / "modules.json").exists():
        # a plain transformer folder: sentence-transformers takes the tokenizer's limit
        tokenizer = source / "tokenizer_config.json"
        if tokenizer.is_file():
            length = json.loads(tokenizer.read_text()).get("model_max_length")
            length = length if isinstance(length, int) and length < 10**6 else None
    return min(int(length or default), limit)


def _modules(source: Path) -> list[dict[str, Any]]:
    spec = source / "modules.json"
    if not spec.exists():  # a plain transformer folder: sentence-transformers mean-pools it
        return [{"type": "Transformer", "path": ""}, {"type": "Pooling", "path": None}]
    modules: list[dict[str, Any]] = json.loads(spec.read_text())
    return modules


def _kind(module: dict[str, Any]) -> str:
    return str(module["type"]).rsplit(".", 1)[-1]


def _pooling(source: Path, module: dict[str, Any]) -> dict[str, Any]:
    """The Pooling module's config; mean pooling for a plain folder (no modules.json)."""
    if module["path"] is None:
        return {"pooling_mode_mean_tokens": True}
    return _read_json(source / module["path"] / "config.json")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():  # a folder without a pooling config: sentence-transformers' mean
        return {"pooling_mode_mean_tokens": True}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _plain(name: str) -> str:
    """Weight names without the ``bert.`` prefix some checkpoints have, and with the
    ``gamma``/``beta`` of old LayerNorm checkpoints as ``weight``/``bias``."""
    name = name.removeprefix("bert.")
    if ".LayerNorm." in name:
        name = name.replace(".gamma", ".weight").replace(".beta", ".bias")
    return name
