"""``inferloom fleet FLEET.yaml``: run many sessions as Ray tasks against one shared knowledge base."""

from __future__ import annotations

import argparse
import json
from typing import Any

from inferloom.commands.common import progress_printer
from inferloom.fleet.driver import run_fleet
from inferloom.fleet.plan import load_fleet

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    plan = load_fleet(args.fleet, out=args.out, kb=args.kb)
    if args.plan:
        console.print_json(json.dumps({"out": str(plan.out), "sessions": [s.public() for s in plan.sessions]}))
        return 0
    progress = progress_printer(args, err)
    progress(f"fleet: {len(plan.sessions)} sessions in {plan.out}; `inferloom fleet {args.fleet}"
             f"{' --out ' + str(plan.out) if args.out else ''}` again resumes the unfinished ones")
    res = run_fleet(plan, address=args.address, num_cpus=args.num_cpus, num_gpus=args.num_gpus,
                    progress=progress)
    for s in res.statuses:
        console.print(s.line(), highlight=False, markup=False)
    console.print(f"fleet report: {res.report}", highlight=False, markup=False)
    return 0 if res.ok else 1
