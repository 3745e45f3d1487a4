"""DISCO: distributed DNN inference with sparse communications."""

__version__ = "0.1.0"
