"""Kernel backends for the KERNEL phase: the Protocol (base), target
selection (select), the gates (gates), backends (torch_backend, registry) and
how the engine switches a kernel on (apply). The Triton kernel library is
``catalog/``."""
