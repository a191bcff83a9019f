"""``inferloom export``: write a session's kept changes (patch series and final configuration) for review."""

from __future__ import annotations

import argparse
from typing import Any

from pathlib import Path

from inferloom.commands.common import output_dir
from inferloom.patches.export import export_session

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    if args.out:  # its own session's directory may hold the export (the default is DIR/export)
        output_dir(args.out, "--out", own_session=Path(args.dir))
    res = export_session(args.dir, args.out)
    console.print(f"exported to {res['out']}: {len(res['series'])} patch(es), final_config.json, README.md "
                  "(for review: inferloom never promotes anything)", highlight=False, markup=False)
    return 0
