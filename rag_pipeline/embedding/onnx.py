"""The local ONNX Runtime backend with int8 weights (`embedding.backend: onnx-int8`).

The model's transformer is exported from its sentence-transformers folder once (this needs torch and the `onnx`
package), its MatMul weights quantised to int8 per output channel (only those: quantising the embedding lookup
as well lost far more accuracy), and the file kept under `embedding.models_dir/onnx/`, named by the weights. Running it needs only onnxruntime and the
tokenizer. Pooling and normalisation follow the model's own sentence-transformers configuration.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag_pipeline.embedding.locations import (
    ModelUnavailableError,
    ResolvedModel,
    load_tokenizer,
    max_sequence_length,
    weights_digest,
)

_export_lock = threading.Lock()


def quantized_model_path(model: ResolvedModel, models_dir: Path) -> Path:
    """Named by the weights (rag_pipeline.embedding.locations.weights_digest), not the folder they sit in: two machines with the same
    weights share the file name, and new weights in the same folder get a file of their own."""
    folder = Path(model.location)
    return Path(models_dir) / "onnx" / f"{folder.name}-{weights_digest(folder).removeprefix('sha256:')[:16]}-int8.onnx"


def export_quantized(model: ResolvedModel, target: Path) -> Path:
    """Export the transformer to ONNX and quantise its MatMul weights to int8 (needs torch and onnx)."""
    try:
        import torch
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from transformers import AutoModel
    except ImportError as exc:
        raise ModelUnavailableError(f"exporting {model.name} to ONNX needs torch, transformers and onnx ({exc}); "
                                    f"or copy {target.name} from a machine that has them into {target.parent}") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(model.location)
    network = AutoModel.from_pretrained(model.location).eval()
    sample = tokenizer(["an example sentence"], return_tensors="pt")
    names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in sample]
    # Names of this process's own: two processes exporting at once must not write into one file.
    floating = target.with_suffix(f".{os.getpid()}.float.onnx")

    class ByName(torch.nn.Module):  # the model's forward takes these by keyword; its positional order varies
        def __init__(self) -> None:
            super().__init__()
            self.network = network

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.network(**dict(zip(names, tensors, strict=True))).last_hidden_state

    with torch.no_grad():
        torch.onnx.export(
            ByName().eval(), tuple(sample[name] for name in names), str(floating), input_names=names,
            output_names=["last_hidden_state"], opset_version=17, dynamo=False,
            dynamic_axes={**{name: {0: "batch", 1: "tokens"} for name in names},
                          "last_hidden_state": {0: "batch", 1: "tokens"}},
        )
    partial = target.with_suffix(f".{os.getpid()}.partial.onnx")
    # Per output channel: one scale per column kept cosine to the float model at 0.99 here; one per tensor, 0.95.
    quantize_dynamic(str(floating), str(partial), op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8,
                     per_channel=True)
    os.replace(partial, target)  # whole or absent: a crash mid-export leaves no half file under the real name
    floating.unlink(missing_ok=True)
    return target


class OnnxEmbedder:
    """Sentence embeddings from the int8 ONNX transformer: tokenise, run, pool as the model says, normalise."""

    def __init__(self, name: str, model: ResolvedModel, models_dir: Path, batch_size: int = 32):
        import onnxruntime

        folder = Path(model.location)
        if not (folder / "modules.json").exists():
            raise ModelUnavailableError(f"{model.name}: the onnx-int8 backend needs a local sentence-transformers "
                                        f"folder, not {model.location}")
        path = quantized_model_path(model, models_dir)
        with _export_lock:
            if not path.exists():
                export_quantized(model, path)
        self.name = name
        self.batch_size = batch_size
        self.tokenizer = load_tokenizer(model.location)
        self.max_seq_length = max_sequence_length(model.location)
        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}
        modules = json.loads((folder / "modules.json").read_text())
        pooling_path = next((folder / m["path"] / "config.json" for m in modules if m["type"].endswith("Pooling")),
                            None)
        pooling = json.loads(pooling_path.read_text()) if pooling_path and pooling_path.exists() else {}
        self.cls_pooling = bool(pooling.get("pooling_mode_cls_token"))
        self.normalize = any(m["type"].endswith("Normalize") for m in modules)
        self.dimensions = int(self._run(["dimension probe"]).shape[1])
        self._lock = threading.Lock()

    def _run(self, texts: list[str]) -> np.ndarray:
        encoded = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_seq_length,
                                 return_tensors="np")
        feeds = {name: encoded[name].astype(np.int64) for name in self.inputs if name in encoded}
        hidden = self.session.run(["last_hidden_state"], feeds)[0]
        if self.cls_pooling:
            vectors = hidden[:, 0]
        else:
            mask = encoded["attention_mask"][..., None].astype(np.float32)
            vectors = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
        if self.normalize:
            vectors = vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)
        return vectors.astype(np.float32)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        # Sorted by length so each batch pads to its own longest input, then put back in order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        with self._lock:
            for start in range(0, len(order), self.batch_size):
                chosen = order[start:start + self.batch_size]
                out[chosen] = self._run([texts[i] for i in chosen])
        return out

    def embed_query(self, text: str) -> np.ndarray:
        with self._lock:
            return self._run([text])[0]
