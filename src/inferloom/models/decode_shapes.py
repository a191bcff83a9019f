"""The shape of a ``generate()``'s decode steps, from the workload's lengths alone (pure arithmetic): what the
cost model (:mod:`inferloom.measure.costs`) and the kernel backends (the shapes a kernel is checked at,
:mod:`inferloom.kernels.torch_backend`, :mod:`inferloom.kernels.catalog_backend`) both use."""

from __future__ import annotations

__all__ = ["mean_decode_context"]


def mean_decode_context(input_len: int, output_len: int) -> float:
    """Mean KV length over the ``output_len - 1`` decode steps of one
    ``generate()`` (contexts ``L+1 .. L+n-1``): ``L + n/2``."""
    return float(input_len) + float(output_len) / 2.0
