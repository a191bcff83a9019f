"""``inferloom kb``: the recipe knowledge base (lookup, list, show, export, import)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from inferloom.commands.common import output_file, spec_from_args
from inferloom.kb import RecipeStore, WorkloadKey, format_lookup
from inferloom.redact import redact
from inferloom.session.atomic import write_json_atomic

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    if args.kb_command == "export":  # checked before the KB is opened: nothing written on a refusal
        output_file(args.file, "kb export", force=args.force)
    with RecipeStore(args.kb) as store:
        if args.kb_command == "lookup":
            spec = spec_from_args(args)
            res = store.lookup(WorkloadKey.from_spec(spec), min_confidence=args.min_confidence)
            console.print(format_lookup(res), highlight=False, markup=False)
        elif args.kb_command == "list":
            recipes = store.list_recipes()
            if not recipes:
                console.print("the knowledge base holds no recipe yet", highlight=False)
            for r in recipes:
                w = r.winner or {}
                ratio = f"x{w['ratio']:.3f}" if w.get("ratio") else "no winner"
                promo = w.get("promotion") or {}
                mark = f"  [promoted by {promo['by']}]" if promo.get("by") else ""
                console.print(f"#{r.id} {r.status:5s} {ratio:10s} " + " | ".join(str(v) for v in r.key.to_dict().values())
                              + mark, highlight=False, markup=False)
        elif args.kb_command == "show":
            console.print(json.dumps(store.show(args.id).to_dict(), indent=2, default=str), highlight=False, markup=False)
        elif args.kb_command == "export":
            doc = store.export_document()
            write_json_atomic(args.file, redact(doc))
            console.print(f"exported {len(doc.get('recipes', []))} recipes to {args.file}", highlight=False)
        elif args.kb_command == "import":
            r = store.import_json(args.file)
            console.print(f"imported {args.file}: {r}", highlight=False, markup=False)
    return 0
