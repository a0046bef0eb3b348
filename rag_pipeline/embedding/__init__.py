"""Embedding models: where weights live and what they are called, the local sentence-transformers and ONNX encoders, remote endpoints and the reranker."""
