"""An installed server's flags, read from its own argparse ``--help``, and the
knob space cut down to them (vLLM and SGLang both print argparse help).

* :func:`parse_help`: the option strings (long and short, both halves of a
  ``--x`` / ``--no-x`` boolean pair, ``--[no-]x`` written either way) and the
  ``{a,b,c}`` choices argparse lists, from a help text. Only the usage block
  and the option header lines (indented two spaces, as argparse writes them)
  count; prose that mentions a flag, the epilog's examples included, does not.
* :func:`probe_server_flags`: runs ``PYTHON -m MODULE OPTION`` for each of the
  framework's help ``options`` in turn (vLLM: ``--help=all``, then ``--help``:
  ``vllm_flags``) until one lists options, once per (python, module, server
  version) in this process.
  A probe that fails or runs past its timeout returns ``flags=None``: the
  caller keeps its static table and says so; nothing is blocked.
* :func:`knob_flags`: the flags each knob can emit, derived from the
  framework's own ``to_launch`` (one source of truth).
* :func:`filter_knobs`: keeps the knobs whose flags the server has (an
  environment-only knob stays; a knob with an environment fallback stays and
  says so); each dropped knob with why. A choice knob whose value is its
  flag's argument (``VERBATIM_CHOICES``) keeps only the values the server's
  help lists for that flag. The framework's tables (``to_launch``, its
  environment fallbacks and verbatim choices) are arguments: ``vllm_flags``
  and ``sglang_flags`` bind them.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from inferloom.process_group import run_in_group
from inferloom.workloads.base import AdapterError, Knob

__all__ = ["HELP_TIMEOUT_S", "ServerFlags", "parse_help", "probe_server_flags", "knob_flags",
           "filter_knobs", "without_dropped", "clear_cache"]

#: seconds one ``--help`` may take (importing vLLM: ~7 s on 2 CPU cores)
HELP_TIMEOUT_S = 120.0

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NO_PAIR = re.compile(r"--\[no-\]([A-Za-z0-9][\w-]*)")
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z0-9][\w-]*)")
_CHOICES = re.compile(r"(--?[A-Za-z0-9][\w-]*)[ =]\{([^{}\s]*)\}")
_HEADER = re.compile(r"^  (--?[A-Za-z0-9][\w-]*|--\[no-\][\w-]+)")


@dataclass(frozen=True)
class ServerFlags:
    """What the probe learned: ``flags`` None when it could not read them."""

    flags: frozenset[str] | None
    source: str  # the help option that listed them, or "unavailable"
    version: str
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    def has(self, flag: str) -> bool:
        """True when the server lists ``flag`` (or its flags are unknown)."""
        return self.flags is None or flag in self.flags

    def to_dict(self) -> dict[str, Any]:
        """For ``describe()`` and the manifest."""
        return {"source": self.source, "server_version": self.version,
                "count": None if self.flags is None else len(self.flags),
                "flags": None if self.flags is None else sorted(self.flags),
                "error": self.error, "probe_s": round(self.seconds, 2)}


def _expand(text: str) -> str:
    return _NO_PAIR.sub(lambda m: f"--{m.group(1)} --no-{m.group(1)}", text)


def parse_help(text: str) -> tuple[frozenset[str], dict[str, tuple[str, ...]]]:
    """``(flags, choices)`` of an argparse help text (see the module docstring)."""
    lines = _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    flags: set[str] = set()
    choices: dict[str, tuple[str, ...]] = {}
    in_usage = False
    for raw in lines:
        if raw.lower().startswith("usage:"):
            in_usage = True
            raw = raw[len("usage:"):]
        elif in_usage and not raw.strip():
            in_usage = False
        if in_usage:
            chunk = _expand(raw)  # the program name, metavars and choices never start with a dash
            flags.update(_FLAG.findall(chunk))
        elif _HEADER.match(raw):
            head = _expand(re.split(r"\s{2,}", raw.strip(), maxsplit=1)[0])
            for part in re.split(r",\s+|\s+(?=--?[A-Za-z0-9\[])", head):
                m = _FLAG.match(part.strip())
                if m:
                    flags.add(m.group(1))
            chunk = head
        else:
            continue
        for name, vals in _CHOICES.findall(chunk):
            items = tuple(v for v in vals.split(",") if v)
            if items:
                choices[name] = items
    return frozenset(flags), choices


def _decode(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", errors="replace")


_CACHE: dict[tuple[str, str, str], ServerFlags] = {}


def clear_cache() -> None:
    """Forget every probe of this process (tests)."""
    _CACHE.clear()


def probe_server_flags(python: str, module: str, version: str, env: Mapping[str, str] | None = None,
                       timeout_s: float = HELP_TIMEOUT_S, options: Sequence[str] = ("--help",)) -> ServerFlags:
    """The server's flags from ``python -m module OPTION``, each of ``options`` tried in order (the first
    that exits 0 with options in its output wins), cached per ``(python, module, version)``; never raises."""
    python = os.path.abspath(python) if os.sep in python else python  # it runs from /, as the import check does
    key = (python, module, version)
    if key in _CACHE:
        return _CACHE[key]
    run_env = dict(os.environ if env is None else env)
    run_env.pop("PYTHONPATH", None)  # the server's environment is its own
    run_env.setdefault("NO_COLOR", "1")
    errors: list[str] = []
    t0 = time.perf_counter()
    result: ServerFlags | None = None
    for opt in options:
        try:
            rc, out, err = run_in_group([python, "-m", module, opt], timeout=timeout_s, env=run_env, cwd="/")
        except OSError as exc:
            errors.append(f"{python} can't be run ({exc.strerror or exc})")
            break
        if rc is None:
            errors.append(f"`{module} {opt}` ran past {timeout_s:.0f} s")
            break  # another try would wait as long again
        flags, choices = parse_help(_decode(out))
        if rc == 0 and flags:
            result = ServerFlags(flags, opt, version, choices, seconds=time.perf_counter() - t0)
            break
        last = (_decode(err).strip().splitlines() or ["no option in its output"])[-1][:200]
        errors.append(f"`{module} {opt}` exited {rc} ({last})")
    if result is None:
        result = ServerFlags(None, "unavailable", version, error="; ".join(errors) or "no help text",
                             seconds=time.perf_counter() - t0)
    _CACHE[key] = result
    return result


def _non_default_values(k: Knob) -> list[Any]:
    if k.kind == "bool":
        return [not k.default]
    if k.kind == "choice":
        return [c for c in (k.choices or ()) if c != k.default]
    return [v for v in dict.fromkeys((k.low, k.high)) if v is not None and v != k.default]


def knob_flags(knobs: Iterable[Knob], to_launch: Callable[..., Any]) -> dict[str, tuple[str, ...]]:
    """knob -> the flags ``to_launch`` emits for it at any non-default value
    (an empty tuple: the knob sets only environment variables)."""
    knobs = list(knobs)
    stock = {k.name: k.default for k in knobs}
    out: dict[str, tuple[str, ...]] = {}
    for k in knobs:
        found: set[str] = set()
        for value in _non_default_values(k):
            _, _, origin = to_launch({**stock, k.name: value})
            found.update(f for f, (name, _v) in origin.items() if name == k.name and f.startswith("-"))
        out[k.name] = tuple(sorted(found))
    return out


def filter_knobs(knobs: Iterable[Knob], server: ServerFlags, to_launch: Callable[..., Any],
                 env_fallback: Mapping[str, str] | None = None, verbatim: Mapping[str, str] | None = None,
                 ) -> tuple[list[Knob], dict[str, str], dict[str, str]]:
    """``(kept, dropped, notes)``: ``dropped`` maps each knob the installed
    server can't take to why; ``notes`` a kept knob that falls back to an
    environment variable (``env_fallback``: knob -> variable). ``verbatim``: choice knob -> its flag,
    narrowed to the choices the help lists. Unknown flags (``server.flags`` None) keep all."""
    env_fallback, verbatim = env_fallback or {}, verbatim or {}
    knobs = list(knobs)
    if server.flags is None:
        return knobs, {}, {}
    needs = knob_flags(knobs, to_launch)
    kept: list[Knob] = []
    dropped: dict[str, str] = {}
    notes: dict[str, str] = {}
    for k in knobs:
        name = k.name
        missing = [f for f in needs[k.name] if f not in server.flags]
        if not missing:
            k, why = _narrow(k, server, verbatim)
            if k is None:
                dropped[name] = why
                continue
            if why:
                notes[k.name] = why
            kept.append(k)
        elif k.name in env_fallback:
            kept.append(k)
            notes[k.name] = (f"the installed server ({server.version}) has no {', '.join(missing)}; "
                             f"set through the {env_fallback[k.name]} environment variable instead")
        else:
            dropped[k.name] = (f"the installed server ({server.version}) has no {', '.join(missing)} "
                               f"(its `{server.source}` lists {len(server.flags)} flags); never proposed")
    return kept, dropped, notes


def _narrow(k: Knob, server: ServerFlags, verbatim: Mapping[str, str]) -> tuple[Knob | None, str]:
    """``k`` with only the values the server lists for its flag (None: only the default is left) and why."""
    flag = verbatim.get(k.name)
    offered = server.choices.get(flag) if flag else None
    if k.kind != "choice" or not offered:
        return k, ""
    keep = tuple(c for c in (k.choices or ()) if c == k.default or str(c) in offered)
    lost = [str(c) for c in (k.choices or ()) if c not in keep]
    if not lost:
        return k, ""
    why = f"the installed server ({server.version}) offers no {flag} {', '.join(lost)}"
    if len(keep) <= 1:
        return None, why + "; nothing else to try, never proposed"
    return dataclasses.replace(k, choices=keep), why + "; those values are never proposed"


def without_dropped(values: Mapping[str, Any], static_knobs: Sequence[Knob], dropped: Mapping[str, str],
                    what: str) -> dict[str, Any]:
    """``values`` less the knobs the installed server can't take (``dropped``: knob -> why), where they
    are at their default (a session started before, a ``stack`` that lists every knob); a dropped knob
    set off its default is refused."""
    out = dict(values)
    static = {k.name: k for k in static_knobs}
    for name in set(out) & set(dropped):
        if out[name] != static[name].default and str(out[name]) != str(static[name].default):
            raise AdapterError(f"{what} knob '{name}'={out[name]!r}: {dropped[name]}; not launched",
                               kind="unsupported_flag")
        del out[name]
    return out
