"""The checks a handed-over session's pin ledger passes before ``verify --rebuild`` gives any of it to pip.

A pin's name and version come from ``manifest.json``, a file the session's author wrote: a name such as
``evilpkg @ file:///DIR`` (a direct reference pip builds, running its backend), ``--index-url=http://...#``
or ``--dry-run`` (parsed by pip as an option) must never reach pip's command line. :func:`check_pin`
accepts only

* a name matching the package-name pattern of PEP 508
  (``^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$``, ASCII, the whole string);
* a version that parses as PEP 440 (:class:`packaging.version.Version`), exactly as written (no
  surrounding whitespace);
* and in either, nothing starting with ``-`` and none of ``@``, ``/``, ``:``, ``;`` or whitespace.

:func:`check_pins` checks every entry of a ledger and reports every refused pin in one line
(:class:`PinError`), so that nothing is installed when one pin is bad.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from inferloom.errors import InferloomError

try:  # packaging comes with transformers; a rebuilt virtualenv of a few pins (a test's) may lack it
    from packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover - the same rule, by PEP 440's own pattern
    Version = None  # type: ignore[assignment,misc]
    InvalidVersion = ValueError  # type: ignore[assignment,misc]

__all__ = ["PinError", "check_pin", "check_pins", "NAME_PATTERN", "VERSION_PATTERN"]

NAME_PATTERN = re.compile(r"([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])", re.ASCII)
#: PEP 440's version pattern (its appendix B, as packaging.version has it): used where packaging is not installed
VERSION_PATTERN = re.compile(r"""
    v?
    (?:(?P<epoch>[0-9]+)!)?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?P<pre>[-_\.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_\.]?(?P<pre_n>[0-9]+)?)?
    (?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_\.]?(?P<post_l>post|rev|r)[-_\.]?(?P<post_n2>[0-9]+)?))?
    (?P<dev>[-_\.]?(?P<dev_l>dev)[-_\.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_\.][a-z0-9]+)*))?
""", re.VERBOSE | re.IGNORECASE | re.ASCII)
_FORBIDDEN = (("@", "contains '@' (a direct reference)"), ("/", "contains '/' (a path or URL)"),
              (":", "contains ':' (a URL)"), (";", "contains ';' (an environment marker)"))
_SHOWN = 80  # characters of a refused value shown in the message


class PinError(InferloomError, ValueError):
    """A pin of the session's ledger is not a plain package name and PEP 440 version: exit 2, nothing installed."""

    def __init__(self, message: str, refused: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        #: ``(the pin as shown, the rule it broke)`` for each refused pin
        self.refused = refused or []


def _shown(value: Any) -> str:
    """``value`` in one line, quoted, control characters escaped, cut to a readable length."""
    text = ascii(value) if isinstance(value, str) else f"{type(value).__name__} {ascii(value)}"
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "...'"


def _common_rule(what: str, value: Any) -> str | None:
    """The first rule ``value`` (a pin's name or version) breaks that both share, or None."""
    if not isinstance(value, str):
        return f"the {what} is not a string"
    if not value:
        return f"the {what} is empty"
    if value.startswith("-"):
        return f"the {what} starts with '-' (pip would read it as an option)"
    for ch, why in _FORBIDDEN:
        if ch in value:
            return f"the {what} {why}"
    if any(c.isspace() for c in value):
        return f"the {what} contains whitespace"
    return None


def _name_rule(name: Any) -> str | None:
    rule = _common_rule("name", name)
    if rule is None and not NAME_PATTERN.fullmatch(name):
        rule = "the name is not a package name (letters, digits, '.', '_', '-'; a letter or digit at each end)"
    return rule


def _version_rule(version: Any) -> str | None:
    rule = _common_rule("version", version)
    if rule is None:
        try:
            if Version is None:
                if not VERSION_PATTERN.fullmatch(version):
                    raise InvalidVersion(version)
            else:
                Version(version)
        except InvalidVersion:
            rule = "the version is not a PEP 440 version"
    return rule


def _rules(name: Any, version: Any) -> list[str]:
    return [r for r in (_name_rule(name), _version_rule(version)) if r]


def _message(refused: list[tuple[str, str]]) -> str:
    what = "; ".join(f"{pin}: {rule}" for pin, rule in refused)
    return (f"manifest.json pins refused ({len(refused)}): {what}; this manifest is not trusted: nothing was "
            "installed (a pin must be a plain package name and a PEP 440 version; check where the session came "
            "from before rebuilding it)")


def check_pin(name: Any, version: Any) -> None:
    """Refuse (:class:`PinError`) a pin whose ``name`` or ``version`` could be more than ``NAME==VERSION`` to pip."""
    rules = _rules(name, version)
    if rules:
        refused = [(f"{_shown(name)}=={_shown(version)}", ", ".join(rules))]
        raise PinError(_message(refused), refused)


def check_pins(packages: Iterable[Mapping[str, Any] | Any]) -> None:
    """Check every pin of a ledger (``pins.packages``: ``{"name", "version", ...}`` entries); one
    :class:`PinError` listing every refused pin, raised before anything is installed."""
    refused = []
    for p in packages:
        if not isinstance(p, Mapping):
            refused.append((_shown(p), "the entry is not an object with a name and a version"))
            continue
        name, version = p.get("name"), p.get("version")
        rules = _rules(name, version)
        if rules:
            refused.append((f"{_shown(name)}=={_shown(version)}", ", ".join(rules)))
    if refused:
        raise PinError(_message(refused), refused)

