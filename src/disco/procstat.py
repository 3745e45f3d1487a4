"""This process's memory (stdlib only): the torch-free engine's :mod:`disco_edge.procstat`, so both engines
report the same figure."""

from disco_edge.procstat import peak_rss_mb, rss_mb, torch_loaded

__all__ = ["peak_rss_mb", "rss_mb", "torch_loaded"]
