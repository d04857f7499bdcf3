"""Compression operators (pure functions over flat tensors) and error feedback."""
