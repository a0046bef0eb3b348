"""A BERT encoder as an ONNX graph, written from its safetensors weights: the onnx-int8 backend's model without
torch.

torch.onnx.export needs torch, and torch on the public package index is a CUDA build of several GB: an install
for CPUs should not download it to export a 90 MB model once. The folders rag_pipeline.embedding.light reads (a
BERT encoder with absolute positions, mean or CLS pooling, normalisation: all-MiniLM-L6-v2 among them) are
written here node by node, with the same arithmetic as that numpy encoder and as transformers' BertModel:
embeddings and their LayerNorm, then per layer self-attention (the padding mask added to the scores), its output
projection, a residual LayerNorm, the exact (erf) GELU feed-forward and another residual LayerNorm. The output is
`last_hidden_state`, as torch's export names it; rag_pipeline.embedding.onnx quantises it and pools.
"""

from __future__ import annotations

import math

import numpy as np

from rag_pipeline.embedding.light import BertFolder

OPSET = 17  # LayerNormalization is an ONNX operator from 17
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def bert_graph(bert: BertFolder):  # -> onnx.ModelProto (onnx is imported here only: the pipeline extra has it)
    """The encoder of `bert` as an ONNX model: inputs input_ids, attention_mask, token_type_ids (int64, batch ×
    tokens), output last_hidden_state (float32, batch × tokens × hidden)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes: list = []
    initializers: list = []
    w = bert.weights

    def constant(name: str, value: np.ndarray) -> str:
        initializers.append(numpy_helper.from_array(value, name))
        return name

    def node(op: str, inputs: list[str], output: str, **attributes) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attributes))
        return output

    def layer_norm(x: str, prefix: str, output: str) -> str:
        return node("LayerNormalization", [x, constant(f"{prefix}.weight", w[f"{prefix}.weight"]),
                                           constant(f"{prefix}.bias", w[f"{prefix}.bias"])], output,
                    axis=-1, epsilon=bert.eps)

    def linear(x: str, prefix: str, output: str) -> str:
        # (in, out) as a MatMul's second input: the layout torch's export gives, which quantisation reads per column
        weight = constant(f"{prefix}.weight", np.ascontiguousarray(w[f"{prefix}.weight"].T))
        product = node("MatMul", [x, weight], f"{output}.product")
        return node("Add", [product, constant(f"{prefix}.bias", w[f"{prefix}.bias"])], output)

    heads, hidden = bert.heads, bert.hidden
    head = hidden // heads
    split_heads = constant("shape.split_heads", np.array([0, 0, heads, head], dtype=np.int64))
    merge_heads = constant("shape.merge_heads", np.array([0, 0, hidden], dtype=np.int64))

    # Embeddings: word + position (0 … tokens - 1) + token type.
    length = node("Gather", [node("Shape", ["input_ids"], "input_shape"),
                             constant("axis.tokens", np.array(1, dtype=np.int64))], "tokens")
    positions = node("Range", [constant("zero", np.array(0, dtype=np.int64)), length,
                               constant("one", np.array(1, dtype=np.int64))], "position_ids")
    words = node("Gather", [constant("embeddings.word_embeddings.weight", w["embeddings.word_embeddings.weight"]),
                            "input_ids"], "words")
    placed = node("Gather", [constant("embeddings.position_embeddings.weight",
                                      w["embeddings.position_embeddings.weight"]), positions], "positions")
    typed = node("Gather", [constant("embeddings.token_type_embeddings.weight",
                                     w["embeddings.token_type_embeddings.weight"]), "token_type_ids"], "types")
    x = node("Add", [node("Add", [words, placed], "words_positions"), typed], "embedded")
    x = layer_norm(x, "embeddings.LayerNorm", "embeddings")

    # Padding masked as transformers masks it: the lowest float added to the scores of padded keys.
    mask = node("Cast", [node("Unsqueeze", ["attention_mask", constant("axes.mask", np.array([1, 2], dtype=np.int64))],
                              "mask_4d")], "mask_float", to=TensorProto.FLOAT)
    lowest = np.array(np.finfo(np.float32).min, dtype=np.float32)
    mask_bias = node("Mul", [node("Sub", [constant("one_float", np.array(1.0, dtype=np.float32)), mask], "masked"),
                             constant("lowest", lowest)], "mask_bias")
    scale = constant("attention_scale", np.array(1.0 / math.sqrt(head), dtype=np.float32))
    root_half = constant("root_half", np.array(1.0 / math.sqrt(2.0), dtype=np.float32))
    half = constant("half", np.array(0.5, dtype=np.float32))

    for layer in range(bert.layers):
        p = f"encoder.layer.{layer}"

        def projected(name: str, perm: list[int], x: str = x, p: str = p) -> str:
            flat = linear(x, f"{p}.attention.self.{name}", f"{p}.{name}")
            return node("Transpose", [node("Reshape", [flat, split_heads], f"{p}.{name}.heads")], f"{p}.{name}.t",
                        perm=perm)

        query = projected("query", [0, 2, 1, 3])  # batch, heads, tokens, head
        key = projected("key", [0, 2, 3, 1])  # batch, heads, head, tokens
        value = projected("value", [0, 2, 1, 3])
        scores = node("Add", [node("Mul", [node("MatMul", [query, key], f"{p}.qk"), scale], f"{p}.scaled"),
                              mask_bias], f"{p}.scores")
        weights = node("Softmax", [scores], f"{p}.weights", axis=-1)
        attended = node("Transpose", [node("MatMul", [weights, value], f"{p}.context")], f"{p}.context.t",
                        perm=[0, 2, 1, 3])
        attended = node("Reshape", [attended, merge_heads], f"{p}.attended")
        attention = linear(attended, f"{p}.attention.output.dense", f"{p}.attention.dense")
        x = layer_norm(node("Add", [attention, x], f"{p}.attention.residual"), f"{p}.attention.output.LayerNorm",
                       f"{p}.attention.out")
        inner = linear(x, f"{p}.intermediate.dense", f"{p}.intermediate")
        erf = node("Erf", [node("Mul", [inner, root_half], f"{p}.gelu.scaled")], f"{p}.gelu.erf")
        gelu = node("Mul", [node("Mul", [inner, half], f"{p}.gelu.half"),
                            node("Add", [erf, constant(f"{p}.gelu.one", np.array(1.0, dtype=np.float32))],
                                 f"{p}.gelu.sum")], f"{p}.gelu")
        output = linear(gelu, f"{p}.output.dense", f"{p}.output")
        x = layer_norm(node("Add", [output, x], f"{p}.output.residual"), f"{p}.output.LayerNorm", f"{p}.out")
    node("Identity", [x], "last_hidden_state")

    graph = helper.make_graph(
        nodes, "bert_encoder",
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"]) for name in INPUTS],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", hidden])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="rag_pipeline.embedding.bert_graph")
    model.ir_version = 8  # what onnxruntime releases of the last two years all read
    return model
