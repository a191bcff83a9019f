"""The kernel library for the KERNEL phase, below the engines (it imports nothing from workloads/, measure/,
phases/: tests/test_layers.py): the Protocol (base), target selection (select), the gates (gates), backends
(torch_backend, catalog_backend, registry), torch's operators (torch_ops), the guards and registry of the
kernels an LLM writes (guards, written, written_set). The Triton kernel library is ``catalog/``; how an engine
switches a kernel on is beside the engine (:mod:`inferloom.workloads.engine_kernels`,
:mod:`inferloom.workloads.engine_written`)."""
