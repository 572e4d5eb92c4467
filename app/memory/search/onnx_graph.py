"""The operations of a BERT sentence encoder, as ONNX nodes over numpy weights.

:class:`BertGraph` grows one graph: each method adds the nodes of one part of
``transformers.BertModel`` (in evaluation: no dropout) or of a sentence-transformers module,
and returns the name of its output. :mod:`app.memory.search.onnx_build` decides the order.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT = "sentence_embedding"
OPSET = 17
"""LayerNormalization is an operator from opset 17 on."""
DENSE_ACTIVATIONS = {"Identity": None, "Tanh": "Tanh", "Sigmoid": "Sigmoid", "ReLU": "Relu"}
"""sentence-transformers' Dense activations (by class name) and the ONNX operator of each."""


class BertGraph:
    """Nodes and initializers of one graph; inputs are ``[batch, tokens]`` int64 tensors."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.weights = weights
        self.nodes: list[tuple[str, list[str], list[str], dict[str, Any]]] = []
        self.constants: dict[str, np.ndarray] = {}
        self._count = 0

    def _op(self, kind: str, inputs: list[str], **attributes: Any) -> str:
        self._count += 1
        output = f"{kind.lower()}_{self._count}"
        self.nodes.append((kind, inputs, [output], attributes))
        return output

    def _const(self, name: str, value: np.ndarray) -> str:
        self.constants[name] = value
        return name

    def _weight(self, name: str, *, transpose: bool = False) -> str:
        value = self.weights[name].astype(np.float32)
        return self._const(name, np.ascontiguousarray(value.T) if transpose else value)

    def _linear(self, x: str, prefix: str) -> str:
        """torch's Linear: x @ W^T + b (W stored transposed, as torch's exporter does)."""
        product = self._op("MatMul", [x, self._weight(f"{prefix}.weight", transpose=True)])
        return self._op("Add", [product, self._weight(f"{prefix}.bias")])

    def _layer_norm(self, x: str, prefix: str, eps: float) -> str:
        scale, bias = self._weight(f"{prefix}.weight"), self._weight(f"{prefix}.bias")
        return self._op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=eps)

    def embeddings(self, config: dict[str, Any]) -> str:
        """Word + position + token type embeddings, then LayerNorm; also the attention bias."""
        words = self._op("Gather", [self._weight("embeddings.word_embeddings.weight"), "input_ids"])
        shape = self._op("Shape", ["input_ids"])
        tokens = self._op(
            "Gather", [shape, self._const("one", np.array(1, dtype=np.int64))], axis=0
        )
        zero = self._const("zero", np.array(0, dtype=np.int64))
        positions = self._op("Range", [zero, tokens, self._const("step", np.array(1, np.int64))])
        where = self._op(
            "Gather", [self._weight("embeddings.position_embeddings.weight"), positions]
        )
        types = self._op(
            "Gather", [self._weight("embeddings.token_type_embeddings.weight"), "token_type_ids"]
        )
        summed = self._op("Add", [self._op("Add", [words, where]), types])
        eps = float(config.get("layer_norm_eps", 1e-12))
        # The mask as transformers applies it: 0 where attended, float32's minimum elsewhere.
        mask = self._op("Cast", ["attention_mask"], to=1)  # FLOAT
        mask = self._op("Unsqueeze", [mask, self._const("axes_1_2", np.array([1, 2], np.int64))])
        inverted = self._op("Sub", [self._const("one_f", np.array(1.0, np.float32)), mask])
        lowest = self._const("lowest", np.array(np.finfo(np.float32).min, np.float32))
        self.attention_bias = self._op("Mul", [inverted, lowest])
        return self._layer_norm(summed, "embeddings.LayerNorm", eps)

    def layer(self, x: str, prefix: str, config: dict[str, Any]) -> str:
        """One encoder layer: self-attention, then the feed-forward, each with its residual."""
        heads = int(config["num_attention_heads"])
        size = int(config["hidden_size"]) // heads
        eps = float(config.get("layer_norm_eps", 1e-12))
        split = self._const("split_shape", np.array([0, 0, heads, size], np.int64))

        def by_head(name: str) -> str:  # [b, t, hidden] -> [b, heads, t, size]
            projected = self._linear(x, f"{prefix}.attention.self.{name}")
            return self._op(
                "Transpose", [self._op("Reshape", [projected, split])], perm=[0, 2, 1, 3]
            )

        query, key, value = by_head("query"), by_head("key"), by_head("value")
        keys_t = self._op("Transpose", [key], perm=[0, 1, 3, 2])
        scores = self._op("MatMul", [query, keys_t])
        scale = self._const("attention_scale", np.array(1 / math.sqrt(size), np.float32))
        scores = self._op("Add", [self._op("Mul", [scores, scale]), self.attention_bias])
        context = self._op("MatMul", [self._op("Softmax", [scores], axis=-1), value])
        context = self._op("Transpose", [context], perm=[0, 2, 1, 3])
        merged_shape = self._const("merged_shape", np.array([0, 0, heads * size], np.int64))
        context = self._op("Reshape", [context, merged_shape])
        attended = self._linear(context, f"{prefix}.attention.output.dense")
        x = self._layer_norm(
            self._op("Add", [attended, x]), f"{prefix}.attention.output.LayerNorm", eps
        )
        inner = self._linear(x, f"{prefix}.intermediate.dense")
        outer = self._linear(self._gelu(inner), f"{prefix}.output.dense")
        return self._layer_norm(self._op("Add", [outer, x]), f"{prefix}.output.LayerNorm", eps)

    def _gelu(self, x: str) -> str:
        """The exact GELU BERT uses: x * (1 + erf(x / sqrt 2)) / 2."""
        root = self._const("sqrt2", np.array(math.sqrt(2.0), np.float32))
        half = self._const("half", np.array(0.5, np.float32))
        one = self._const("one_f", np.array(1.0, np.float32))
        erf = self._op("Erf", [self._op("Div", [x, root])])
        return self._op("Mul", [self._op("Mul", [x, half]), self._op("Add", [erf, one])])

    def mean(self, x: str) -> str:
        """sentence-transformers' mean pooling: the attended tokens' average."""
        mask = self._op("Cast", ["attention_mask"], to=1)
        mask = self._op("Unsqueeze", [mask, self._const("axis_2", np.array([2], np.int64))])
        axis = self._const("axis_1", np.array([1], np.int64))
        total = self._op("ReduceSum", [self._op("Mul", [x, mask]), axis], keepdims=0)
        count = self._op("ReduceSum", [mask, axis], keepdims=0)
        floor = self._const("count_floor", np.array(1e-9, np.float32))
        return self._op("Div", [total, self._op("Max", [count, floor])])

    def cls(self, x: str) -> str:
        """The first token's state (CLS pooling)."""
        return self._op("Gather", [x, self._const("zero", np.array(0, np.int64))], axis=1)

    def dense(self, x: str, folder: Path) -> str:
        """A sentence-transformers Dense module: activation(x @ W^T + b)."""
        from safetensors.numpy import load_file

        config = json.loads((folder / "config.json").read_text())
        prefix = f"dense_{self._count}"
        for key, value in load_file(str(folder / "model.safetensors")).items():
            self.weights[f"{prefix}.{key.removeprefix('linear.')}"] = value
        if config.get("bias", True):
            y = self._linear(x, prefix)
        else:
            y = self._op("MatMul", [x, self._weight(f"{prefix}.weight", transpose=True)])
        activation = str(config.get("activation_function", "")).rsplit(".", 1)[-1]
        operator = DENSE_ACTIVATIONS.get(activation)
        return self._op(operator, [y]) if operator else y

    def normalize(self, x: str) -> str:
        """torch.nn.functional.normalize: x / max(||x||, 1e-12)."""
        norm = self._op("ReduceL2", [x], axes=[-1], keepdims=1)  # axes: an input from opset 18
        floor = self._const("norm_floor", np.array(1e-12, np.float32))
        return self._op("Div", [x, self._op("Max", [norm, floor])])

    def model(self, output: str, onnx: Any) -> Any:
        """The ONNX model whose output `output` is named :data:`OUTPUT`."""
        helper, numpy_helper = onnx.helper, onnx.numpy_helper
        nodes = [helper.make_node(k, i, o, **a) for k, i, o, a in self.nodes]
        nodes.append(helper.make_node("Identity", [output], [OUTPUT]))
        inputs = [
            helper.make_tensor_value_info(name, onnx.TensorProto.INT64, ["batch", "tokens"])
            for name in INPUTS
        ]
        result = helper.make_tensor_value_info(OUTPUT, onnx.TensorProto.FLOAT, ["batch", None])
        initializers = [numpy_helper.from_array(v, name=k) for k, v in self.constants.items()]
        graph = helper.make_graph(nodes, "sentence_embedding", inputs, [result], initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8  # what onnxruntime releases from 1.14 on read
        onnx.checker.check_model(model)
        return model
