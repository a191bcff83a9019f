"""``inferloom validate``: validate a spec and print it resolved (relative paths
made absolute against the spec file's folder; files, interpreters and the
checkout checked to exist, without importing or starting anything; a ``.gguf`` model is
checked to be one and shown as its path: the first command that runs it converts it)."""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from inferloom.commands.common import spec_from_args
from inferloom.preflight import check_runnable

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    spec = spec_from_args(args, convert_models=False)
    check_runnable(spec, imports=False)
    console.print(yaml.safe_dump(spec.to_dict(), sort_keys=False), highlight=False)
    return 0
