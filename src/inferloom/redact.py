"""Secrets never reach the disk: the one redaction every writer uses.

Two kinds of secret are recognised:

* **credentials in URLs**: the password of ``scheme://user:PASSWORD@host``
  (the user name stays: it says which account, not how to log in) and the
  value of a query parameter whose name looks like a credential
  (``?password=...``, ``&token=...``); both become :data:`REDACTED`. This is
  applied to every string, free text included (an error message quoting a
  URL), by :func:`redact_text` and, over a JSON value, :func:`redact`.
* **environment variables whose names say secret**: any name containing one
  of :data:`SECRET_NAME_MARKERS` (KEY, TOKEN, SECRET, PASS — so PASSWORD,
  PASSPHRASE and PASSWD too —, CREDENTIAL, AUTH) is a secret whatever its
  value (:func:`is_secret_name`); :func:`redact_env` replaces such values.

Who applies it: the manifest (its ``env``), ``state.json``, every ledger
entry, the reports, the bench result, the KB export and the progress lines.
A URL kept without its password (``state.json``'s ``run_options.kb_url``) is
recognisable with :func:`has_redacted_password`: ``resume`` then takes the
real URL from the command line or the environment again.

Imports nothing from inferloom, so any module may use it.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

__all__ = ["REDACTED", "SECRET_NAME_MARKERS", "is_secret_name", "redact_text", "redact_url", "redact",
           "redact_env", "has_redacted_password", "without_secrets"]

REDACTED = "***"  # what SQLAlchemy's render_as_string(hide_password=True) writes too
SECRET_NAME_MARKERS = ("KEY", "TOKEN", "SECRET", "PASS", "PASSWORD", "PASSPHRASE", "CREDENTIAL", "AUTH")

# scheme://user:password@ ; the password runs to the last '@' of the token (a raw '@' in it is still hidden)
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*):(?P<pw>\S*)@")
_QUERY = re.compile(r"(?P<head>[?&;][^=&\s]*(?:" + "|".join(SECRET_NAME_MARKERS) + r")[^=&\s]*=)(?P<value>[^&\s]*)",
                    re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """True when an environment variable's (or a field's) name says it holds a secret."""
    upper = name.upper()
    return any(m in upper for m in SECRET_NAME_MARKERS)


def _pw(m: re.Match[str]) -> str:
    return m.group("head") + ":" + (REDACTED if m.group("pw") else "") + "@"


def _query(m: re.Match[str]) -> str:
    return m.group("head") + (REDACTED if m.group("value") else "")


def redact_text(text: str) -> str:
    """``text`` with every URL password and credential-like query value replaced by :data:`REDACTED`."""
    if "://" not in text and "=" not in text:
        return text
    return _QUERY.sub(_query, _USERINFO.sub(_pw, text))


def redact_url(url: str | None) -> str | None:
    """A URL (or a file path: unchanged) without its credentials; None stays None."""
    return None if url is None else redact_text(url)


def has_redacted_password(url: str | None) -> bool:
    """True when ``url`` is a URL whose credentials were redacted (it can't log in as it stands)."""
    return bool(url) and "://" in url and (f":{REDACTED}@" in url or f"={REDACTED}" in url)  # type: ignore[operator]


def redact(value: Any) -> Any:
    """A JSON value (a copy) with :func:`redact_text` applied to every string in it, keys too."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {redact_text(k) if isinstance(k, str) else k: redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def redact_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Environment variables as they may be written: a secret-named one's value is
    :data:`REDACTED`, any other's value has its URL credentials removed."""
    return {k: REDACTED if is_secret_name(k) else redact_text(v) for k, v in environ.items()}


def without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of the environment ``env`` without the variables whose names say secret (:func:`is_secret_name`):
    what a process that runs someone else's code (a handed-over session's re-measure, pip building its pins) gets."""
    return {k: v for k, v in env.items() if not is_secret_name(k)}
