"""The local ONNX Runtime backend with int8 weights (`embedding.backend: onnx-int8`).

The model's transformer is exported from its sentence-transformers folder once, its MatMul weights quantised to
int8 per output channel (only those: quantising the embedding lookup
as well lost far more accuracy), and the file kept under `embedding.models_dir/onnx/`, named by the weights. Running it needs only onnxruntime and the
tokenizer. Pooling and normalisation follow the model's own sentence-transformers configuration.

A plain BERT encoder (all-MiniLM-L6-v2 and the folders rag_pipeline.embedding.light reads) is written as ONNX
from its weights, without torch (rag_pipeline.embedding.bert_graph); any other architecture is exported through
torch.onnx, which needs the `torch` extra.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from rag_pipeline.embedding.bert_graph import bert_graph
from rag_pipeline.embedding.light import read_bert_folder
from rag_pipeline.embedding.locations import (
    ModelUnavailableError,
    ResolvedModel,
    load_tokenizer,
    max_sequence_length,
    weights_digest,
)
from rag_pipeline.extras import install_hint
from rag_pipeline.workers.threads import UNBOUNDED, embedder_threads, usable_cores

log = logging.getLogger(__name__)
_export_lock = threading.Lock()


def quantized_model_path(model: ResolvedModel, models_dir: Path) -> Path:
    """Named by the weights (rag_pipeline.embedding.locations.weights_digest), not the folder they sit in: two machines with the same
    weights share the file name, and new weights in the same folder get a file of their own."""
    folder = Path(model.location)
    return Path(models_dir) / "onnx" / f"{folder.name}-{weights_digest(folder).removeprefix('sha256:')[:16]}-int8.onnx"


def export_quantized(model: ResolvedModel, target: Path) -> Path:
    """Export the transformer to ONNX and quantise its MatMul weights to int8: a plain BERT encoder written from
    its weights (onnx alone), any other through torch.onnx."""
    try:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        raise ModelUnavailableError(f"exporting {model.name} to ONNX needs onnx and onnxruntime ({exc}): "
                                    f"{install_hint('pipeline')}") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    # Names of this process's own: two processes exporting at once must not write into one file.
    floating = target.with_suffix(f".{os.getpid()}.float.onnx")
    bert = read_bert_folder(Path(model.location))
    if bert is not None:
        onnx.save(bert_graph(bert), str(floating))
    else:
        _export_through_torch(model, target, floating)
    partial = target.with_suffix(f".{os.getpid()}.partial.onnx")
    # Per output channel: one scale per column kept cosine to the float model at 0.99 here; one per tensor, 0.95.
    with _root_warnings_at_debug():  # its advice to pre-process the graph, printed on the root logger
        quantize_dynamic(str(floating), str(partial), op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8,
                         per_channel=True)
    os.replace(partial, target)  # whole or absent: a crash mid-export leaves no half file under the real name
    floating.unlink(missing_ok=True)
    return target


@contextmanager
def _root_warnings_at_debug() -> Iterator[None]:
    """Records logged on the root logger meanwhile go to this module's log at debug level: onnxruntime's quantiser
    logs advice there, which a user would read as an error in the middle of a run's progress."""

    def demote(record: logging.LogRecord) -> bool:
        log.debug("%s", record.getMessage())
        return False

    root = logging.getLogger()
    root.addFilter(demote)
    try:
        yield
    finally:
        root.removeFilter(demote)


def _export_through_torch(model: ResolvedModel, target: Path, floating: Path) -> None:
    try:
        import torch
        from transformers import AutoModel
    except ImportError as exc:
        raise ModelUnavailableError(
            f"{model.name} is not a plain BERT encoder, so exporting it to ONNX needs torch and transformers "
            f"({exc}): {install_hint('torch')}; or copy {target.name} from a machine that has them into "
            f"{target.parent}") from exc
    tokenizer = load_tokenizer(model.location)
    network = AutoModel.from_pretrained(model.location).eval()
    sample = tokenizer(["an example sentence"], return_tensors="pt")
    names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in sample]

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


class OnnxEmbedder:
    """Sentence embeddings from the int8 ONNX transformer: tokenise, run, pool as the model says, normalise."""

    def __init__(self, name: str, model: ResolvedModel, models_dir: Path):
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
        self.max_seq_length = max_sequence_length(model.location)
        self._tokenize = _fast_tokenizer(folder, self.max_seq_length) or _transformers_tokenizer(
            model.location, self.max_seq_length)
        # The prompts sentence-transformers' Embedder puts before queries and documents (rag_pipeline.embedding.local).
        prompts = {k: v for k, v in (_json(folder / "config_sentence_transformers.json").get("prompts") or {}).items()
                   if v}
        self._query_prompt = prompts.get("query", "")
        self._document_prompt = next((prompts[k] for k in ("document", "passage") if k in prompts), "")
        # One thread per run and no spinning: texts run one at a time, in parallel (embed_documents).
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}
        self._lock = threading.Lock()
        modules = json.loads((folder / "modules.json").read_text())
        pooling_path = next((folder / m["path"] / "config.json" for m in modules if m["type"].endswith("Pooling")),
                            None)
        pooling = json.loads(pooling_path.read_text()) if pooling_path and pooling_path.exists() else {}
        self.cls_pooling = bool(pooling.get("pooling_mode_cls_token"))
        self.normalize = any(m["type"].endswith("Normalize") for m in modules)
        self.dimensions = int(self._run("dimension probe").shape[0])

    def _run(self, text: str) -> np.ndarray:
        """One text's vector. One text per run: no padding, and its vector does not depend on what it is batched
        with (int8 activations are quantised over the whole input, padding included). On two cores a text at a
        time on each was 2.8x faster than batches of 32 on both (docs/benchmarks.md)."""
        encoded = self._tokenize([text])
        feeds = {name: encoded[name] for name in self.inputs if name in encoded}
        hidden = self.session.run(["last_hidden_state"], feeds)[0][0]
        vector = hidden[0] if self.cls_pooling else hidden.mean(axis=0)  # no padding: every token counts
        if self.normalize:
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
        return vector.astype(np.float32)

    def parallel_runs(self) -> int:
        """Texts in flight at once: the threads this process's embedder may use now (a run's parse workers take
        the other cores: rag_pipeline.workers.threads), else every core."""
        threads = embedder_threads()
        return usable_cores() if threads == UNBOUNDED else threads

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        texts = [self._document_prompt + text for text in texts]
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        with self._lock:  # one caller's texts at a time: two would each take every core
            parallel = min(self.parallel_runs(), len(texts))
            if parallel == 1:
                return np.stack([self._run(text) for text in texts])
            with ThreadPoolExecutor(parallel, thread_name_prefix="onnx-embed") as pool:
                return np.stack(list(pool.map(self._run, texts)))

    def embed_query(self, text: str) -> np.ndarray:
        return self._run(self._query_prompt + text)


Tokenize = Callable[[list[str]], dict[str, np.ndarray]]


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _fast_tokenizer(folder: Path, max_length: int) -> Tokenize | None:
    """The folder's `tokenizer.json` through `tokenizers` alone, padded and truncated as transformers' fast
    tokenizer (which wraps the same file) does: a search or a small refresh does not import transformers (0.7 s)
    or torch. None where the folder lacks what that needs."""
    pad_token = _json(folder / "tokenizer_config.json").get("pad_token")
    if isinstance(pad_token, dict):  # a serialised AddedToken
        pad_token = pad_token.get("content")
    if not (folder / "tokenizer.json").is_file() or not isinstance(pad_token, str) \
            or _json(folder / "sentence_bert_config.json").get("do_lower_case"):
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    pad_id = tokenizer.token_to_id(pad_token)
    if pad_id is None:
        return None
    tokenizer.enable_truncation(max_length)  # the file's own settings are the hub export's, not the model's
    tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
    lock = threading.Lock()  # the settings above live in the tokenizer object

    def tokenize(texts: list[str]) -> dict[str, np.ndarray]:
        with lock:
            encodings = tokenizer.encode_batch(texts)
        return {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64)}

    return tokenize


def _transformers_tokenizer(location: str, max_length: int) -> Tokenize:
    tokenizer = load_tokenizer(location)

    def tokenize(texts: list[str]) -> dict[str, np.ndarray]:
        encoded = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="np")
        return {name: np.asarray(value, dtype=np.int64) for name, value in encoded.items()}

    return tokenize
