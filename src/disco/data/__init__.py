"""Datasets (loaders yield ``(images, targets)`` batches of float tensors)."""
