"""The code under optimization: k nearest neighbours by Euclidean distance."""

import math
import os

import numpy as np


def pairwise_dist(x):
    """All pairwise Euclidean distances, one pair at a time."""
    rows = x.tolist()
    n = len(rows)
    out = np.empty((n, n))
    for i, a in enumerate(rows):
        for j, b in enumerate(rows):
            out[i, j] = math.sqrt(sum((p - q) * (p - q) for p, q in zip(a, b)))
    return out


def describe():
    """What this kernel computes (used by notes and debugging only)."""
    return {
        "distance": "euclidean",
        "layout": "row-major",
        "dtype": "float64",
    }


def neighbors(d, k):
    """Indices of the k nearest other points of each row, nearest first."""
    if os.environ.get("KNN_SELECT", "sort") == "partition":
        part = np.argpartition(d, k, axis=1)[:, : k + 1]
        order = np.take_along_axis(d, part, axis=1).argsort(axis=1, kind="stable")
        idx = np.take_along_axis(part, order, axis=1)
    else:
        idx = np.argsort(d, axis=1, kind="stable")
    return idx[:, 1 : k + 1]
