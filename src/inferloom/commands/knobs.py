"""``inferloom knobs``: the knob space of the workload's adapter."""

from __future__ import annotations

import argparse
from typing import Any

from inferloom.commands.common import spec_from_args
from inferloom.preflight import check_runnable
from inferloom.report.console import print_knobs
from inferloom.workloads.registry import make_adapter

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    spec = spec_from_args(args)
    check_runnable(spec, imports=False)
    adapter = make_adapter(spec)
    try:
        print_knobs(adapter.describe(), adapter.knob_space(), console)
    finally:
        adapter.close()
    return 0
