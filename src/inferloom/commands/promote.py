"""``inferloom promote SESSION_DIR --by NAME [--note TEXT] [--bundle-hash H] [--kb URL]``: a person's
approval of a closed session's winner, recorded in the session's ledger and the KB
(:mod:`inferloom.evidence.promote`). inferloom never promotes on its own."""

from __future__ import annotations

import argparse
from typing import Any

from inferloom.evidence.promote import promote_session

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    p = promote_session(args.dir, by=args.by, note=args.note, kb_url=args.kb, expected_hash=args.bundle_hash)
    console.print(f"promoted session {p['session_id']} by {p['by']}: x{p['ratio']:.3f} [{p['ci_low']:.3f}, "
                  f"{p['ci_high']:.3f}] (final compare, ledger #{p['final_ledger_seq']}), changes {p['changes']}; "
                  f"bundle {p['bundle_hash']}; recorded in the ledger (#{p['seq']}) and the KB {p['kb']} "
                  f"(recipe #{p['recipe_id']}, now preferred by lookups)", highlight=False, markup=False, soft_wrap=True)
    return 0
