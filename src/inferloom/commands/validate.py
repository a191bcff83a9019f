"""``inferloom validate``: validate a spec and print it resolved."""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from inferloom.commands.common import spec_from_args

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    spec = spec_from_args(args)
    console.print(yaml.safe_dump(spec.to_dict(), sort_keys=False), highlight=False)
    return 0
