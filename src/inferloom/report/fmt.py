"""The report's formatters, in one place: percent changes, ratios, numbers,
SI prefixes, knob changes, HTML-escaped text.

Where two renderers format one quantity differently (``report.md`` prints a
NaN ratio as ``+nan%``, the HTML page prints ``n/a``; the console tables use
two decimals), each variant keeps its own name here so that every rendered
output stays exactly what it was."""

from __future__ import annotations

import html
import math
from typing import Any, Mapping

__all__ = ["esc", "num", "pct", "pct_safe", "pct_2dp", "ratio_x", "number", "si", "changes_text", "sandbox_text"]


def esc(x: Any) -> str:
    """HTML-escaped text of any value (quotes too); None is empty."""
    return html.escape("" if x is None else str(x), quote=True)


def num(x: Any) -> float | None:
    """``x`` as a finite float, or None (not a number, NaN, infinite)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def pct(r: float | None) -> str:
    """A ratio as a signed percent change, one decimal: 1.123 -> '+12.3%';
    None -> 'n/a' (``report.md``; any other value is formatted as it is)."""
    return "n/a" if r is None else f"{(r - 1) * 100:+.1f}%"


def pct_safe(r: Any) -> str:
    """Like :func:`pct`, but anything that is not a finite number is 'n/a' (the HTML page)."""
    v = num(r)
    return "n/a" if v is None else f"{(v - 1) * 100:+.1f}%"


def pct_2dp(ratio: float) -> str:
    """A ratio as a signed percent change, two decimals: 1.1234 -> '+12.34%' (the console tables)."""
    return f"{(ratio - 1) * 100:+.2f}%"


def ratio_x(r: Any, digits: int = 3) -> str:
    """A ratio as a factor: 1.2345 -> 'x1.234' (``digits`` decimals); 'n/a' if not a finite number."""
    v = num(r)
    return "n/a" if v is None else f"x{v:.{digits}f}"


def number(x: Any, fmt: str = ",.1f", none: str = "n/a") -> str:
    """``x`` in the format spec ``fmt``; ``none`` if not a finite number."""
    v = num(x)
    return none if v is None else format(v, fmt)


def si(x: float, unit: str = "", digits: int = 3) -> str:
    """1.5e12 -> '1.5 T' + unit."""
    if x == 0:
        return f"0 {unit}".strip()
    for exp, p in ((15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k"), (0, "")):
        if abs(x) >= 10**exp:
            return f"{x / 10**exp:.{digits}g} {p}{unit}".strip()
    return f"{x:.{digits}g} {unit}".strip()


def changes_text(changes: Mapping[str, Any]) -> str:
    """Knob changes as 'k=v, k2=v2' (empty for no change)."""
    return ", ".join(f"{k}={v}" for k, v in changes.items())


def sandbox_text(sb: Mapping[str, Any]) -> tuple[str, str]:
    """(headline, detail) of a custom session's sandbox record (ledger kind
    ``sandbox``): the headline is what a reader must not miss."""
    if sb.get("mode") == "bwrap":
        net = "; the Specialist command shares the host's network" if sb.get("specialist_network") else ""
        return "Sandbox: bubblewrap", f"{sb.get('version') or ''}: {sb.get('isolation') or ''}{net}".strip(": ")
    head = "Patches ran without a sandbox" if sb.get("patches") else "Commands ran without a sandbox"
    return head, str(sb.get("reason") or "")
