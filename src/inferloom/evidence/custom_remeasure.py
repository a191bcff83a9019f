"""``verify --remeasure`` for a custom workload: the exported patch series applied to a fresh clone of the
user's checkout, then the final stack measured paired against stock.

:func:`rebuild_trees` (in the fresh process of :mod:`inferloom.evidence.remeasure`):

1. ``git clone`` of the checkout the session recorded (``custom.repo`` in the manifest's spec) into a
   temporary directory: the user's checkout is only read;
2. two worktrees at the recorded stock commit (``state.json``: ``extra.source.stock``): ``stock`` and
   ``final``;
3. the session's patch series, exported again (:func:`inferloom.patches.export.export_session`, the same
   files ``inferloom export`` writes; an unpacked export archive's own ``export/patches``), applied in
   ``final`` in order: ``git am`` for a ``git format-patch`` file (what the export's README tells a reviewer
   to run), ``git apply --index`` then a commit for a bare
   diff (an export made after the session's workspace was deleted: the patch texts from the ledger). The
   commits get the session's fixed identity and date (as the session's own commits did:
   :mod:`inferloom.patches.worktree`), so a faithful series rebuilds **the same commit id** as the
   session's final stack;
4. the rebuilt tree is compared with the session's: the same commit id, else the same tree as the
   session's final commit where the clone has it (the session fetched its branch into the checkout),
   else it can't be compared (said so). A different tree is a failure: nothing is measured.

:func:`measure` then runs stock's tree against the final tree through the session's protocol and the
workload's own quality gate (fail-closed), with the protected files' checksums the session took at stock
verified before every run (:mod:`inferloom.workloads.protected`), then applies the session's clock check
(:func:`inferloom.measure.clock_check.clock_check`, as :mod:`inferloom.phases.custom_clock` did for every
patch) to the re-measured pairs: inferloom's own wall clock around each run against the stock run's reported
``timed_s``, the noise pooled with the session's A/A. A final stack whose claimed gain the clock does not see
(``gain_not_seen_by_clock``; or can't check: ``clock_unverifiable``) fails the re-measure, overlap or not.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from inferloom.bench import overall_verdict, run_seed_base
from inferloom.measure.clock_check import clock_check
from inferloom.patches.export import export_session
from inferloom.measure.compare import References, compare
from inferloom.workloads.base import AdapterError
from inferloom.workloads.custom import TREE_KEY, CustomAdapter, git

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["rebuild_trees", "measure"]

_IDENTITY = ("inferloom", "inferloom@localhost")


def _env(date: int) -> dict[str, str]:
    stamp = f"{int(date)} +0000"
    name, mail = _IDENTITY
    return {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": mail, "GIT_COMMITTER_NAME": name,
            "GIT_COMMITTER_EMAIL": mail, "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}


def _has(sha: str, cwd: Path) -> bool:
    return git("cat-file", "-e", f"{sha}^{{commit}}", cwd=cwd, check=False).returncode == 0


_PATCH_NAME = re.compile(r"patches/[A-Za-z0-9][A-Za-z0-9._-]*\.patch")


def _series(d: Path, out: Path, error: type[Exception]) -> list[Path]:
    """The patch series: an unpacked ``inferloom export`` archive's own ``export/patches`` (what its SHA256SUMS
    covered) when the session's workspace is not there; else exported again from the session. Each listed name
    must be a plain ``patches/<name>.patch`` under ``export/`` (a handed-over archive can't name a file elsewhere:
    ``error`` naming it)."""
    listed = d / "export" / "final_config.json"
    if not (d / "workspace" / "repo.git").is_dir() and listed.is_file():
        try:
            names = (json.loads(listed.read_text()).get("source") or {}).get("series") or []
        except (OSError, ValueError, AttributeError):
            names = []
        bad = [str(n) for n in names if not (isinstance(n, str) and _PATCH_NAME.fullmatch(n))
               or ((d / "export" / n).exists() and (d / "export" / n).resolve().parent != (d / "export" / "patches").resolve())]
        if bad:
            raise error(f"{d}: export/final_config.json lists {bad[0]!r} as a patch, not a plain file under "
                        "export/patches/ (refused: an archive's patches live in it)")
        files = [d / "export" / n for n in names]
        if names and all(f.is_file() for f in files):
            return files
    return [out / s for s in export_session(d, out)["series"]]


def rebuild_trees(d: Path, spec: WorkloadSpec, st: Any, root: Path, error: type[Exception],
                  progress: Callable[[str], None]) -> dict[str, Any]:
    """Stock's and the final stack's trees under ``root`` (see the module docstring); returns the record
    ``{"checkout", "clone", "stock_commit", "session_final_commit", "final_commit", "series", "applied_with",
    "identical_commit", "same_tree", "why"}``; ``error`` (the caller's exception class) when it can't."""
    src = st.extra.source
    if src is None:
        raise error(f"{d}: state.json has no source stack (extra.source) for this custom workload: it was edited "
                    "or written by a different inferloom; nothing to re-measure")
    repo = Path(spec.custom.repo)
    if not repo.is_dir():
        raise error(f"{d}: the session's checkout {repo} (custom.repo in manifest.json) is not there; restore it "
                    "(or clone it to that path) and run verify --remeasure again")
    clone = root / "checkout"
    progress(f"cloning {repo} into a temporary directory (your checkout is only read)")
    try:
        git("clone", "--quiet", "--no-checkout", str(repo), str(clone))
        if not _has(src.stock, clone):
            raise error(f"{d}: the stock commit {src.stock[:12]} the session started from is not in {repo} (rebased, "
                        f"reset or garbage-collected?): fetch or restore it (git fetch <remote> {src.stock}) and "
                        "run verify --remeasure again")
        for name in ("stock", "final"):
            git("worktree", "add", "--quiet", "--detach", str(root / name), src.stock, cwd=clone)
        files = _series(d, root / "export", error)
        final, env, how = root / "final", _env(src.date), set()
        if len(files) != len(src.kept):
            raise error(f"{d}: the exported series has {len(files)} patch(es) but the session kept {len(src.kept)} "
                        "commit(s): the session's workspace or ledger is incomplete; nothing was measured")
        for f, kept in zip(files, src.kept):
            progress(f"applying {f.name} on {src.stock[:10]}")
            if f.read_text(errors="replace").startswith("From "):
                res = git("am", "--quiet", "--whitespace=nowarn", str(f), cwd=final, env=env, check=False)
                how.add("git am")
            else:
                res = git("apply", "--index", "--whitespace=nowarn", str(f), cwd=final, check=False)
                if res.returncode == 0:
                    res = git("commit", "--quiet", "--no-verify", "-m", kept.message, cwd=final, env=env, check=False)
                how.add("git apply")
            if res.returncode != 0:
                raise error(f"{d}: the exported patch {f.name} does not apply on {src.stock[:12]} in a fresh clone of "
                            f"{repo}: {(res.stderr or res.stdout).strip()[-400:]}; nothing was measured")
    except AdapterError as exc:
        raise error(f"{d}: rebuilding the final stack in a fresh clone of {repo} failed ({exc}); nothing was "
                    "measured") from None
    head = git("rev-parse", "HEAD", cwd=final).stdout.strip()
    out: dict[str, Any] = {"checkout": str(repo), "clone": str(clone), "stock_commit": src.stock,
                           "session_final_commit": src.stack, "final_commit": head,
                           "series": [f.name for f in files], "applied_with": " and ".join(sorted(how)) or "nothing",
                           "identical_commit": head == src.stack}
    if head == src.stack:
        out["same_tree"] = True
        out["why"] = f"the series rebuilt the session's final commit {head[:12]} exactly"
    elif _has(src.stack, clone):
        mine = git("rev-parse", f"{head}^{{tree}}", cwd=clone).stdout.strip()
        theirs = git("rev-parse", f"{src.stack}^{{tree}}", cwd=clone).stdout.strip()
        out["same_tree"] = mine == theirs
        out["why"] = (f"commit {head[:12]} differs from the session's {src.stack[:12]} (metadata) but its tree is the "
                      "same" if mine == theirs else f"the rebuilt tree {mine[:12]} differs from the session's final "
                      f"tree {theirs[:12]} (commit {src.stack[:12]})")
    else:
        out["same_tree"] = None
        out["why"] = (f"commit {head[:12]} differs from the session's {src.stack[:12]}, which is not in {repo} to "
                      "compare trees with (its branch was deleted?)")
    return out


def measure(spec: WorkloadSpec, st: Any, trees: dict[str, Any], root: Path, settings: Any,
            progress: Callable[[str], None], noise_pairs: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """Stock's tree against the final tree, paired, with the workload's own quality gate on every final run,
    and the clock check on the pairs (``res["clock"]``; ``noise_pairs``: the session's A/A pairs)."""
    adapter = CustomAdapter(spec, handed_over=True)  # the author's code: sandboxed, no opt-out
    try:
        adapter.protected = st.extra.source.protected  # stock's checksums, verified before every run
        adapter.results_dir = root / "results"
        cmp = compare(adapter, spec, {**st.stock_config, TREE_KEY: str(root / "stock")},
                      {**st.stack, TREE_KEY: str(root / "final")}, settings=settings,
                      seed_base=run_seed_base(spec), refs=References(), quality_sets=("heldout",),
                      progress=progress, labels=("stock", "final"))
    finally:
        adapter.close()
    res = cmp.as_dict()  # the re-measurement's JSON record
    res["verdict"] = overall_verdict(cmp.verdict, cmp.quality.get("passed"), False)
    res["source"] = trees
    res["sandbox"] = adapter.sandbox_record
    clock = clock_check(cmp.pairs, noise_pairs=noise_pairs)
    res["clock"] = clock.to_dict()
    progress(f"clock check: {clock.rule + ': ' if clock.rule else ''}{clock.why}")
    return res
