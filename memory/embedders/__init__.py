"""Turning text into vectors: the Embedder protocol and pipeline, the OpenAI-compatible and the
offline ONNX embedders, the optional cross-encoder re-ranker."""
