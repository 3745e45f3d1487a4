"""Sparsification: score links, select them under a byte budget, prune gradually while fine-tuning."""

from .scores import magnitude_scores, random_scores, taylor_scores
from .select import BUDGETS, cubic_ratio, select_links

__all__ = ["BUDGETS", "cubic_ratio", "magnitude_scores", "random_scores", "select_links", "taylor_scores"]
