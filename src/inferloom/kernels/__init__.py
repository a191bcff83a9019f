"""Kernel backends for the KERNEL phase (see ``catalog/`` for the Triton kernel library)."""
