"""Vectors without torch: a BERT encoder in numpy, for processes that embed a few texts.

A command-line `search` or `eval` spent 15 s loading torch and sentence-transformers to embed one query of a
few dozen tokens, and a refresh that added one small file spent 8 s to embed its two chunks. This reads the same
sentence-transformers folder (its `tokenizer.json` through `tokenizers`, its weights through `safetensors`) and
runs the same arithmetic in float32, one text at a time: the vectors equal the torch model's to within float
rounding (rag_pipeline_tests/test_model_identity.py compares them), so they search and fill the versions that
model built. Only the layout it was checked on is accepted (a BERT encoder with absolute positions, then mean or
CLS pooling, then normalisation); any other folder returns None from `load_bert_encoder` and the caller loads
the full model. Per text it is slower than torch's batches (0.1 s for 256 tokens on 2 cores): it serves the few.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

SUPPORTED_MODULES = (["sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
                      "sentence_transformers.models.Normalize"])


def _erf(x: np.ndarray) -> np.ndarray:
    """numpy has no erf, and BERT's GELU is the exact (erf) one, not the tanh approximation: Abramowitz & Stegun
    7.1.26 in float64, within 1.5e-7 of erf, as close as float32 arithmetic gets anyway."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return (np.sign(x) * (1.0 - poly * np.exp(-z * z))).astype(np.float32)


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + eps) * weight + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / np.float32(math.sqrt(2.0))))


@dataclass(frozen=True)
class BertFolder:
    """What a sentence-transformers folder of the one layout reproduced here says: its weights (names without the
    `bert.` prefix), its transformer's configuration, its pooling ("mean" or "cls"), its length limit and prompts.
    The numpy encoder below and the torch-free ONNX export (rag_pipeline.embedding.bert_graph) both compute it."""

    folder: Path
    weights: dict[str, np.ndarray]
    config: dict[str, Any]
    pooling: str
    max_seq_length: int
    query_prompt: str
    document_prompt: str

    @property
    def heads(self) -> int:
        return int(self.config["num_attention_heads"])

    @property
    def layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def eps(self) -> float:
        return float(self.config.get("layer_norm_eps", 1e-12))

    @property
    def hidden(self) -> int:
        return int(self.config["hidden_size"])


class BertEncoder:
    """One text at a time through a BERT encoder, pooled and normalised as the sentence-transformers folder says,
    with the folder's query and document prompts."""

    def __init__(self, bert: BertFolder) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(bert.folder / "tokenizer.json"))
        self._tokenizer.no_padding()  # the file's own padding and truncation are the hub export's, not the model's
        self._tokenizer.enable_truncation(bert.max_seq_length)
        # Linear layers' weights stored transposed once, so each product reads them in order.
        self._w = {name: np.ascontiguousarray(value.T) if value.ndim == 2 and not name.startswith("embeddings.")
                   else value for name, value in bert.weights.items()}
        self._heads = bert.heads
        self._layers = bert.layers
        self._eps = bert.eps
        self._pooling = bert.pooling
        self._query_prompt = bert.query_prompt
        self._document_prompt = bert.document_prompt
        self.dimensions = bert.hidden

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self._w[f"{name}.weight"] + self._w[f"{name}.bias"]

    def embed_query(self, text: str) -> np.ndarray:
        return self._encode(self._query_prompt + text)

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        return np.stack([self._encode(self._document_prompt + text) for text in texts])

    def _encode(self, text: str) -> np.ndarray:
        ids = np.asarray(self._tokenizer.encode(text).ids, dtype=np.int64)
        w = self._w
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][: len(ids)]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self._eps)
        tokens, hidden = x.shape
        head = hidden // self._heads
        for layer in range(self._layers):
            prefix = f"encoder.layer.{layer}"

            def heads(name: str, x: np.ndarray = x, prefix: str = prefix) -> np.ndarray:
                return self._linear(x, f"{prefix}.attention.self.{name}").reshape(tokens, self._heads, head).transpose(1, 0, 2)

            scores = heads("query") @ heads("key").transpose(0, 2, 1) / np.float32(math.sqrt(head))
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attended = (scores / scores.sum(-1, keepdims=True)) @ heads("value")
            attended = attended.transpose(1, 0, 2).reshape(tokens, hidden)
            x = _layer_norm(self._linear(attended, f"{prefix}.attention.output.dense") + x,
                            w[f"{prefix}.attention.output.LayerNorm.weight"],
                            w[f"{prefix}.attention.output.LayerNorm.bias"], self._eps)
            inner = _gelu(self._linear(x, f"{prefix}.intermediate.dense"))
            x = _layer_norm(self._linear(inner, f"{prefix}.output.dense") + x, w[f"{prefix}.output.LayerNorm.weight"],
                            w[f"{prefix}.output.LayerNorm.bias"], self._eps)
        pooled = x[0] if self._pooling == "cls" else x.mean(0)
        return (pooled / max(float(np.linalg.norm(pooled)), 1e-12)).astype(np.float32)


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def load_bert_encoder(location: str) -> BertEncoder | None:
    """The numpy encoder for the sentence-transformers folder at `location`, or None where the folder is not the
    layout it reproduces exactly, or cannot be read (then the full model must be loaded, and says why if it cannot)."""
    bert = read_bert_folder(Path(location))
    return BertEncoder(bert) if bert else None


def read_bert_folder(folder: Path) -> BertFolder | None:
    """The folder as BertFolder, or None where it is not the layout reproduced here exactly, or cannot be read."""
    try:
        return _read(folder)
    except Exception as exc:  # a folder it cannot read (JSON, safetensors): the full model reads it, or says why
        log.info("%s is not read as a plain BERT encoder (%s): the full model is used", folder, exc)
        return None


def _read(folder: Path) -> BertFolder | None:
    modules = json.loads((folder / "modules.json").read_text()) if (folder / "modules.json").is_file() else None
    config = _json(folder / "config.json")
    if (not modules or [m.get("type") for m in modules] != SUPPORTED_MODULES or modules[0].get("path")
            or config.get("model_type") != "bert" or config.get("position_embedding_type", "absolute") != "absolute"
            or config.get("hidden_act") != "gelu" or not (folder / "tokenizer.json").is_file()
            or not (folder / "model.safetensors").is_file()):
        return None
    pooling_config = _json(folder / modules[1]["path"] / "config.json")
    modes = {mode for mode in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens",
                               "lasttoken") if pooling_config.get(f"pooling_mode_{mode}")}
    if modes not in ({"mean_tokens"}, {"cls_token"}):
        return None
    st_config = _json(folder / "sentence_bert_config.json")
    # Only the length limit, stated: lowercasing before the tokenizer, model kwargs or a limit sentence-transformers
    # derives from the tokenizer are not reproduced here.
    if set(st_config) - {"max_seq_length", "do_lower_case"} or st_config.get("do_lower_case") \
            or not st_config.get("max_seq_length"):
        return None
    st_settings = _json(folder / "config_sentence_transformers.json")
    if st_settings.get("default_prompt_name"):  # applied to every text that names no prompt: not reproduced
        return None
    prompts = {name: text for name, text in (st_settings.get("prompts") or {}).items() if text}
    if prompts and not pooling_config.get("include_prompt", True):
        return None  # the prompt's tokens would have to be left out of the mean
    # The prompts sentence-transformers' Embedder uses (rag_pipeline.embedding.local): query, document or passage.
    document_prompt = next((prompts[name] for name in ("document", "passage") if name in prompts), "")
    from safetensors.numpy import load_file

    weights = {name.removeprefix("bert."): value for name, value in load_file(folder / "model.safetensors").items()}
    if "embeddings.word_embeddings.weight" not in weights or any(
            value.dtype != np.float32 for name, value in weights.items() if not name.endswith("position_ids")):
        return None  # half-precision weights would compute in half precision here: other vectors
    max_seq_length = min(int(st_config["max_seq_length"]), int(config.get("max_position_embeddings", 512)))
    return BertFolder(folder, weights, config, "cls" if modes == {"cls_token"} else "mean", max_seq_length,
                      prompts.get("query", ""), document_prompt)
