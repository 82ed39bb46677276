"""Inference methods, one module per family."""
