"""What a spec's ``serving.env`` and ``serving.extra_args`` may not carry (docs/security.md).

A spec is written to disk (manifest, bench result, exports) and handed to other teams, so it carries no
secret: a secret-named environment variable or a token flag is refused at validation, with what to do (set it
in the environment: the server inherits it). Nor may it move the server off loopback or change what inferloom
itself sets (``--host``, ``--port``, ``--model``, ``--served-model-name``), run the model's own code
(``--trust-remote-code``), or change how the server's interpreter loads code (``LD_*``, ``PYTHON*``).
"""

from __future__ import annotations

from pathlib import Path

from inferloom.redact import is_secret_name

__all__ = ["check_serving_env", "check_extra_args", "check_ladder_dir", "FIXED_FLAGS", "REFUSED_FLAGS", "NOT_SECRET",
           "LADDER_FILES"]

#: what the enablement ladder's directories must hold (docs/enablement.md)
LADDER_FILES = {"engine_patches": ((".patch", ".diff"), "unified diffs against the engine's package"),
                "wheelhouse": ((".whl",), "wheels of the alternate engine (and what it needs beyond the server's "
                                          "environment)")}

#: secret-looking names that are not secrets (their value is a setting)
NOT_SECRET = frozenset({"TOKENIZERS_PARALLELISM"})
#: flags inferloom sets itself on every launch
FIXED_FLAGS = ("--host", "--port", "--model", "--served-model-name")
#: flags refused whatever their value, with why
REFUSED_FLAGS = {"--trust-remote-code": "it runs the model directory's own Python in the server"}
_SECRET_FLAG_TAILS = ("-api-key", "-token", "-password", "-passwd", "-secret")  # --api-key, --hf-token, ...


def check_serving_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` unchanged, or ValueError naming the first variable refused and why."""
    for k in env:
        if is_secret_name(k) and k.upper() not in NOT_SECRET:
            raise ValueError(f"{k}: looks like a secret, and a spec is written to disk; set it in the environment "
                             "instead (the server inherits it)")
        if k.upper().startswith(("LD_", "PYTHON")):
            raise ValueError(f"{k}: refused (it changes which code the server's interpreter loads); use "
                             "serving.python for another environment")
    return env


def check_extra_args(args: list[str]) -> list[str]:
    """``args`` unchanged, or ValueError naming the first argument refused and why."""
    for a in args:
        flag = a.split("=", 1)[0].lower() if a.startswith("--") else ""
        if not flag:
            continue
        if flag in FIXED_FLAGS:
            raise ValueError(f"{flag}: inferloom sets it on every launch (the server listens on 127.0.0.1 only); "
                             "remove it from serving.extra_args")
        if flag in REFUSED_FLAGS:
            raise ValueError(f"{flag}: refused ({REFUSED_FLAGS[flag]})")
        if flag.endswith(_SECRET_FLAG_TAILS):
            raise ValueError(f"{flag}: carries a secret, and a spec is written to disk; give the server its "
                             "secret through the environment instead (e.g. VLLM_API_KEY)")
    return args


def check_ladder_dir(value: str | None, key: str) -> str | None:
    """``serving.engine_patches`` / ``serving.wheelhouse``: an existing directory holding at least one file of its
    kind (:data:`LADDER_FILES`), made absolute; ValueError (one line: what, why, what to do) otherwise."""
    if value is None:
        return None
    exts, what = LADDER_FILES[key]
    p = Path(value).expanduser()
    if not p.is_dir():
        raise ValueError(f"{value} is not a directory; serving.{key} names a directory of {what}")
    if not any(f.is_file() and f.name.endswith(exts) for f in p.iterdir()):
        raise ValueError(f"{value} holds no {' or '.join(exts)} file; put the {what} there, or leave serving.{key} out")
    return str(p.resolve())
