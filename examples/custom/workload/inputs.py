"""Benchmark inputs: the points, drawn from the run's seed (never edited by a candidate)."""

import numpy as np


def make_points(seed: int, n: int, dim: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim))
