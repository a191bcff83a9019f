"""Importing triton (and the kernel catalog) for the Triton interpreter, in a test module.

Triton picks interpreter or compiler when a function is decorated, its own standard library (tl.sum,
tl.max...) included, and the interpreter reads TRITON_INTERPRET again at run time. So a test module
that runs kernels on the CPU imports triton and the catalog inside :func:`interpreted_imports`: it sets
TRITON_INTERPRET before triton is imported (re-importing triton and the catalog when something imported
them before without it), and gives the rest of the session its environment back afterwards (a module
that runs kernels keeps it set per test with its own fixture)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator


@contextlib.contextmanager
def interpreted_imports() -> Iterator[None]:
    """Imports made inside see TRITON_INTERPRET=1 and a triton decorated for the interpreter."""
    prev = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" in sys.modules and type(sys.modules["triton"].language.standard.sum).__name__ != "InterpretedFunction":
        for name in [m for m in sys.modules if (m == "triton" or m.startswith("triton.")) and not m.startswith("triton._C")
                     or m.startswith("inferloom.kernels.catalog")]:
            del sys.modules[name]
    try:
        yield
    finally:
        if prev is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = prev
