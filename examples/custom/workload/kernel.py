"""The code under optimization: k nearest neighbours by Euclidean distance."""

import os

import numpy as np


def pairwise_dist(x):
    """All pairwise Euclidean distances, one row at a time."""
    n = x.shape[0]
    out = np.empty((n, n))
    for i in range(n):
        diff = x - x[i]
        out[i] = np.sqrt((diff * diff).sum(axis=1))
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
