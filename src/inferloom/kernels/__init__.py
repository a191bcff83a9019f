"""Kernel backends for the KERNEL phase: the Protocol (base), target
selection (select), the gates (gates), backends (torch_backend,
catalog_backend, registry). The Triton kernel library is ``catalog/``; how
the transformers engine switches a kernel on is beside the engine
(:mod:`inferloom.workloads.engine_kernels`)."""
