"""Halaman's engine: documents → compressed KV cache → answers. Never imports Qt."""

__version__ = "0.1.0"
