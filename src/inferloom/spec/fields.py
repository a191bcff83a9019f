"""The building blocks of the spec's models: a strict frozen base, bounded
numeric fields (each bound stated in its description), and the two helpers
settings objects use to take their defaults and bounds from the spec
(:func:`field_default`, :func:`check_bounds`)."""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["field_default", "check_bounds"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _n(default: Any, lo: float, hi: float, desc: str = "", *, gt: bool = False) -> Any:
    """A numeric field bounded to [lo, hi] (``gt``: (lo, hi]), the bounds stated in its description.
    The upper bounds keep every value a workload a real run (one H200, an 8B model) could use."""
    text = f"{desc}; " if desc else ""
    text += f"{'over' if gt else 'at least'} {lo:g}, at most {hi:g}"
    return Field(default, le=hi, description=text, **({"gt": lo} if gt else {"ge": lo}))


def field_default(model: type[BaseModel], name: str) -> Any:
    """The default ``model`` declares for field ``name``. Settings objects built
    from the spec (the protocol's, the quality contract's, the gates') take their
    defaults from here, never from a second literal."""
    return model.model_fields[name].get_default(call_default_factory=True)


def check_bounds(model: type[BaseModel], values: Mapping[str, Any], section: str) -> None:
    """Check ``values`` (some of ``model``'s fields) against the bounds ``model``
    declares; a ValueError of one line (``SECTION KEY: what, got VALUE``) if one fails."""
    try:
        model.model_validate(values)
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = ".".join(str(x) for x in e["loc"])
        where = f"{section} {loc}" if loc else section
        got = "" if isinstance(e.get("input"), (dict, list)) else f", got {e.get('input')!r}"
        raise ValueError(f"{where}: {e['msg'].removeprefix('Value error, ')}{got}") from None
