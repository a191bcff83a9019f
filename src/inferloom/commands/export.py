"""``inferloom export``: write a session's kept changes (patch series and final configuration) for review;
with ``--out FILE.tar.gz``, the whole evidence bundle as one archive with SHA256SUMS
(:mod:`inferloom.evidence.archive`)."""

from __future__ import annotations

import argparse
from typing import Any

from pathlib import Path

from inferloom.commands.common import output_dir, output_file
from inferloom.evidence.archive import export_archive, is_archive_path
from inferloom.patches.export import export_session

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    if args.out and is_archive_path(args.out):
        output_file(args.out, "--out", force=False, force_flag=None)
        res = export_archive(args.dir, args.out)
        console.print(f"exported to {res['out']}: {len(res['files'])} files (manifest, ledger, reports, "
                      f"{len(res['series'])} patch(es), final configuration, SHA256SUMS); bundle hash "
                      f"{res['bundle_hash']} (check it: `inferloom verify {res['out']}`; approve it: "
                      f"`inferloom promote {args.dir} --by NAME --bundle-hash {res['bundle_hash']}`)",
                      highlight=False, markup=False, soft_wrap=True)
        return 0
    if args.out:  # its own session's directory may hold the export (the default is DIR/export)
        output_dir(args.out, "--out", own_session=Path(args.dir))
    res = export_session(args.dir, args.out)
    console.print(f"exported to {res['out']}: {len(res['series'])} patch(es), final_config.json, "
                  + ("deploy.md, " if res.get("deploy") else "") + ("deploy.sh, " if (res.get("deploy") or {}).get("kind") == "command" else "")
                  + "README.md "
                  "(for review: inferloom never promotes anything)", highlight=False, markup=False)
    return 0
