"""``framework: custom``: the user's own code, run as a command per measurement.

Contract (docs/custom.md):

* The user supplies a git checkout, an entrypoint command, the knobs their
  code reads (each an environment variable or an argument, with a domain) and
  pinned settings (the spec's ``pinned``). The adapter never runs anything in
  the user's checkout: every run happens in a tree inferloom checked out
  itself (``prepare({"@tree": PATH, ...})``, else :attr:`default_tree`, else a
  private clone of the checkout's HEAD made on first use).
* One timed run = one execution of the entrypoint, with ``INFERLOOM_RESULT``
  (a path outside the tree), ``INFERLOOM_SEED`` and the knobs in its
  environment / arguments. The entrypoint writes JSON::

      {"objective": {"value": 123.4, "unit": "rows/s"},
       "quality_gate": {"passed": true, "checks": {...the values it checked...}}}

  A non-zero exit, a timeout, a crash, or a result with no positive finite
  objective is a failed run (``success=False``, the stderr tail kept in
  ``extra``), never a number.
* The quality gate is fail-closed: :meth:`gate_quality` over a candidate's
  runs passes only when every run's gate says ``passed: true``; a missing or
  unparseable gate, or a failed one, rejects with a named rule
  (:data:`GATE_MISSING`, :data:`GATE_UNPARSEABLE`, :data:`GATE_FAILED`).
* Protected files (entrypoint, quality gate, benchmark inputs, the spec's
  ``protected``) are verified against stock's checksums before every run
  (:mod:`inferloom.workloads.protected`); a mismatch is a failed run of kind
  ``protected_file_changed``.
* The protocol's metric is :meth:`objective_metric`: the objective, inverted
  when lower is better, so that "higher is faster" holds for the protocol.
* Every run is sandboxed (:mod:`inferloom.sandbox`, spec ``custom.sandbox``):
  writable only its tree and the result's directory, no network. The
  adapter refuses to exist (exit 2) when the spec has patches and bubblewrap
  can't run, unless the spec opts out; :meth:`describe` records which.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from inferloom import __version__
from inferloom.process_group import run_in_group
from inferloom.sandbox import Sandbox, required, resolve, start_failure
from inferloom.session.state_models import ProtectedFiles
from inferloom.workloads.base import AdapterError, Knob, RunRecord, config_key, resolve_config
from inferloom.workloads.protected import PROTECTED_CHANGED, verify_protected

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["CustomAdapter", "CustomHandle", "GATE_FAILED", "GATE_MISSING", "GATE_UNPARSEABLE", "TREE_KEY",
           "gate_of", "has_patches", "knobs_from_spec"]

TREE_KEY = "@tree"  # reserved configuration key: the source tree a configuration runs in
GATE_MISSING = "quality_gate_missing"
GATE_UNPARSEABLE = "quality_gate_unparseable"
GATE_FAILED = "quality_gate_failed"
STDERR_TAIL = 2000


def knobs_from_spec(custom: Any) -> list[Knob]:
    out = []
    for k in custom.knobs:
        out.append(Knob(name=k.name, kind=k.kind, default=k.default, description=k.description,
                        choices=tuple(k.choices) if k.choices is not None else None, low=k.low, high=k.high,
                        applies_to=frozenset({"cpu", "cuda", "rocm"}), changes_numerics=k.changes_numerics))
    for kn in out:
        kn.validate(kn.default)  # a bad stock value is a spec error, said now
    return out


def has_patches(custom: Any) -> bool:
    """Whether the spec lets patches run (a patch directory or a Specialist command)."""
    return bool(custom.patches.dir or custom.patches.command)


def git(*args: str, cwd: str | Path | None = None, check: bool = True, env: Mapping[str, str] | None = None,
        input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run git; a failure raises AdapterError naming the command and git's message."""
    full_env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", **(env or {})}
    cmd = ["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", "-c", "gc.auto=0", *args]
    res = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, input=input_text)
    if check and res.returncode != 0:
        raise AdapterError(f"git {' '.join(args[:3])} failed: {(res.stderr or res.stdout).strip()[-800:]}", kind="git")
    return res


def gate_of(result: Any) -> tuple[str | None, dict[str, Any]]:
    """(rule or None, the gate block) of one run's parsed result."""
    if not isinstance(result, Mapping) or "quality_gate" not in result:
        return GATE_MISSING, {}
    g = result["quality_gate"]
    if not isinstance(g, Mapping) or not isinstance(g.get("passed"), bool):
        return GATE_UNPARSEABLE, {"raw": repr(g)[:500]}
    return (None if g["passed"] else GATE_FAILED), dict(g)


@dataclass
class CustomHandle:
    id: int
    config: dict[str, Any]
    config_id: str
    tree: Path
    released: bool = False


class CustomAdapter:
    """Runs the user's entrypoint once per timed run (see the module docstring)."""

    name = "custom"

    def __init__(self, spec: WorkloadSpec, *, handed_over: bool = False) -> None:
        """``handed_over``: the session is someone else's (``verify --remeasure``): every run is sandboxed,
        whatever the spec's ``custom.sandbox`` says, or :class:`~inferloom.sandbox.SandboxUnavailable`."""
        if spec.custom is None:
            raise ValueError("CustomAdapter needs a spec with a 'custom' section")
        self.spec = spec
        self.custom = spec.custom
        self.repo = Path(self.custom.repo)
        self._knobs = knobs_from_spec(self.custom)
        self.head = git("rev-parse", "HEAD", cwd=self.repo).stdout.strip()
        self.default_tree: Path | None = None
        self._own_dir: Path | None = None
        self.results_dir: Path | None = None  # where entrypoints write results (a session sets it; else a temp dir)
        self.protected: ProtectedFiles | None = None  # checksums every run verifies first (a session sets them)
        self._own_results: Path | None = None
        self._ids = 0
        self._handles: dict[int, CustomHandle] = {}
        self.sandbox: Sandbox | None
        if handed_over:  # someone else's entrypoint and patches: always sandboxed, whatever their spec says
            self.sandbox = required("re-measuring a handed-over custom session runs its author's entrypoint "
                                    "and patches")
            self.sandbox_record = {**self.sandbox.record(), "handed_over": True}
        else:
            self.sandbox, self.sandbox_record = resolve(self.custom.sandbox, patches=has_patches(self.custom),
                                                        network=self.custom.patches.command_network)

    # -- description --------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {"framework": "custom", "model": f"custom:{self.repo.name}", "device": "cpu",
                "versions": {"inferloom": __version__},
                "source": {"repo": str(self.repo), "head": self.head},
                "entrypoint": list(self.custom.entrypoint), "objective": self.custom.objective,
                "higher_is_better": self.custom.higher_is_better, "timeout_s": self.custom.timeout_s,
                "sandbox": dict(self.sandbox_record)}

    def knob_space(self) -> list[Knob]:
        return list(self._knobs)

    # -- source trees -------------------------------------------------------
    def _private_tree(self) -> Path:
        """A clone of the checkout's HEAD in a temp dir (outside a session)."""
        if self._own_dir is None:
            self._own_dir = Path(tempfile.mkdtemp(prefix="inferloom-custom-"))
            git("clone", "--quiet", "--no-checkout", str(self.repo), str(self._own_dir / "tree"))
            git("checkout", "--quiet", "--detach", self.head, cwd=self._own_dir / "tree")
        return self._own_dir / "tree"

    def prepare(self, config: Mapping[str, Any]) -> CustomHandle:
        cfg = dict(config)
        tree = Path(cfg.pop(TREE_KEY)) if TREE_KEY in cfg else (self.default_tree or self._private_tree())
        resolved = resolve_config(self._knobs, cfg, self.spec.pinned)
        if not tree.is_dir():
            raise AdapterError(f"source tree {tree} does not exist", kind="tree")
        self._ids += 1
        h = CustomHandle(id=self._ids, config=resolved, config_id=f"{config_key(resolved)}@{tree.name}", tree=tree)
        self._handles[h.id] = h
        return h

    def _command(self, h: CustomHandle, seed: int, result: Path) -> tuple[list[str], dict[str, str]]:
        env = {**os.environ, "INFERLOOM_RESULT": str(result), "INFERLOOM_SEED": str(int(seed)),
               "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = list(self.custom.entrypoint)
        for k in self.custom.knobs:
            v = h.config[k.name]
            text = ("1" if v else "0") if isinstance(v, bool) else str(v)
            if k.env:
                env[k.env] = text
            if k.arg:
                if isinstance(v, bool):
                    cmd += [k.arg] if v else []
                else:
                    cmd += [k.arg, text]
        if self.sandbox is not None:  # writable: the tree and the result's directory (outside the tree)
            cmd = self.sandbox.wrap(cmd, cwd=h.tree, writable=[h.tree, result.parent])
        return cmd, env

    # -- timed runs ---------------------------------------------------------
    def run(self, handle: CustomHandle, seed: int) -> RunRecord:
        h = handle
        if h.released or h.id not in self._handles:
            raise ValueError("CustomAdapter: not a live handle of this adapter (released or foreign)")
        if self.results_dir is None:
            self._own_results = self.results_dir = Path(tempfile.mkdtemp(prefix="inferloom-results-"))
        self.results_dir.mkdir(parents=True, exist_ok=True)
        result = self.results_dir / f"result-{h.id}-{int(seed)}-{time.monotonic_ns()}.json"
        cmd, env = self._command(h, seed, result)
        started = time.time()
        t0 = time.perf_counter()

        def fail(msg: str, kind: str, stderr: str = "") -> RunRecord:
            return RunRecord(config_id=h.config_id, seed=seed, success=False, started_at=started,
                             wall_s=time.perf_counter() - t0, num_requests=1, error=msg,
                             extra={"kind": kind, "stderr_tail": stderr[-STDERR_TAIL:], "command": cmd})

        if (changed := verify_protected(h.tree, self.protected)) is not None:  # workloads/protected.py
            return fail(changed, PROTECTED_CHANGED)
        try:
            rc, _out, err = run_in_group(cmd, timeout=self.custom.timeout_s, cwd=h.tree, env=env, text=True)
        except OSError as exc:
            return fail(f"entrypoint could not start: {exc}", "crash")
        if rc is None:
            return fail(f"entrypoint timed out after {self.custom.timeout_s:g} s", "timeout", err or "")
        if (bwrap_says := start_failure(self.sandbox, rc, err)) is not None:
            return fail(f"entrypoint could not start: {bwrap_says}", "crash", err or "")
        wall = time.perf_counter() - t0
        if rc != 0:
            how = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
            tail = ((err or "").strip().splitlines() or ["(no stderr)"])[-1][:300]
            return fail(f"entrypoint failed ({how}): {tail}", "crash" if rc < 0 else "exit", err or "")
        try:
            data = json.loads(result.read_text())
        except FileNotFoundError:
            return fail(f"entrypoint wrote no result to $INFERLOOM_RESULT ({result.name})", "no_result", err or "")
        except (OSError, ValueError) as exc:
            return fail(f"result is not valid JSON: {exc}", "bad_result", err or "")
        finally:
            result.unlink(missing_ok=True)
        obj = data.get("objective") if isinstance(data, Mapping) else None
        value = obj.get("value") if isinstance(obj, Mapping) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            return fail(f"result has no positive finite objective.value (got {value!r})", "bad_result", err or "")
        rule, gate = gate_of(data)
        timed = data.get("timed_s")  # the seconds the objective measured: checked against inferloom's clock
        timed = float(timed) if isinstance(timed, (int, float)) and not isinstance(timed, bool) \
            and math.isfinite(timed) and timed > 0 else None
        return RunRecord(config_id=h.config_id, seed=seed, success=True, started_at=started, wall_s=wall,
                         num_requests=1, output_tokens=1, expected_output_tokens=1,
                         extra={"objective": {"value": float(value), "unit": str(obj.get("unit", ""))},
                                "quality_gate": gate, "gate_rule": rule, "tree": h.tree.name, "timed_s": timed,
                                "stderr_tail": (err or "")[-STDERR_TAIL:]})

    def objective_metric(self, rec: RunRecord) -> float:
        """The protocol's metric: the objective (inverted when lower is better)."""
        if not rec.success:
            raise ValueError(f"run {rec.config_id!r} seed {rec.seed} failed ({rec.error}); it has no objective")
        v = float(rec.extra["objective"]["value"])
        return v if self.custom.higher_is_better else 1.0 / v

    def gate_quality(self, records: list[RunRecord]) -> dict[str, Any]:
        """The quality verdict over a candidate's timed runs (fail-closed)."""
        rules = [r.extra.get("gate_rule") for r in records if r.success]
        if not rules:
            rule, msg = GATE_MISSING, "no successful run reported a quality gate"
        else:
            bad = [x for x in rules if x is not None]
            rule = None if not bad else next(x for x in (GATE_MISSING, GATE_UNPARSEABLE, GATE_FAILED) if x in bad)
            msg = "" if rule is None else {
                GATE_MISSING: f"{rule}: {bad.count(rule)}/{len(rules)} runs wrote no quality_gate block",
                GATE_UNPARSEABLE: f"{rule}: {bad.count(rule)}/{len(rules)} runs wrote a quality_gate without a boolean 'passed'",
                GATE_FAILED: f"{rule}: the quality gate failed in {bad.count(rule)}/{len(rules)} runs",
            }[rule]
        last_failed = next((r.extra.get("quality_gate") for r in records if r.success and r.extra.get("gate_rule")), None)
        out: dict[str, Any] = {"evaluated": True, "passed": rule is None, "rule": rule, "kind": "quality_gate",
                               "runs": len(rules), "failed": [msg] if rule else [],
                               "example": last_failed if rule else (records[-1].extra.get("quality_gate") if records else None)}
        return out

    # -- quality probes of the token contract: not for custom workloads -------
    def prompts(self, seed: int, n: int, length: int) -> list[list[int]]:
        rng = np.random.default_rng(int(seed))
        return rng.integers(0, 1 << 16, size=(n, length)).tolist()

    def greedy(self, handle: Any, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        raise AdapterError("a custom workload judges quality with its own quality_gate, not token probes", kind="custom")

    def score(self, handle: Any, prompts: list[list[int]], continuations: list[list[int]]) -> Any:
        raise AdapterError("a custom workload judges quality with its own quality_gate, not token probes", kind="custom")

    # -- lifetime -----------------------------------------------------------
    def release(self, handle: Any) -> None:
        if isinstance(handle, CustomHandle):
            handle.released = True
            self._handles.pop(handle.id, None)

    def close(self) -> None:
        for h in list(self._handles.values()):
            self.release(h)
        if self._own_results is not None:
            shutil.rmtree(self._own_results, ignore_errors=True)
            self._own_results = self.results_dir = None
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None
