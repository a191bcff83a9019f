"""An MoE preset (``moe_presets``) as a model directory without weights: the architecture's config and the
locally built tokenizer, for a server that makes its own random weights (vLLM ``--load-format dummy``:
seeded, the same in every server, so stock and candidate servers hold identical weights). No 14 GB of
weights are written; a session on it is a kernel and serving benchmark, its outputs are noise (the quality
contract still compares every candidate's outputs with stock's on the same weights).

:func:`moe_preset_dir` writes ``<cache>/server-models/<name>-config-only`` once (the spec's
``model: olmoe-1b-7b`` resolves to it) with :data:`MARKER` saying what it is; the config is written by
transformers' own config class for the architecture, so it loads with ``AutoConfig``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from inferloom.models.moe_presets import MOE_PRESETS
from inferloom.models.tokenizer import build_tokenizer, cache_root, save_tokenizer

__all__ = ["MARKER", "SERVER_ARGS", "moe_preset_dir"]

MARKER = "INFERLOOM_CONFIG_ONLY.json"
#: what a server of a config-only directory needs: its weights are its own (seeded random)
SERVER_ARGS: tuple[str, ...] = ("--load-format", "dummy")


def moe_preset_dir(name: str) -> Path:
    """The preset's config-only model directory, written once (see the module docstring)."""
    if name not in MOE_PRESETS:
        raise ValueError(f"unknown MoE preset {name!r}; expected one of {', '.join(sorted(MOE_PRESETS))}")
    d = cache_root() / "server-models" / f"{name}-config-only"
    if (d / MARKER).is_file():
        return d
    from transformers import AutoConfig  # noqa: PLC0415 - heavy, only when the directory is written

    shape = dict(MOE_PRESETS[name])
    arch, model_type = shape.pop("architecture"), shape.pop("model_type")
    tok = build_tokenizer(int(shape["vocab_size"]))
    ids = {k: getattr(tok, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    cfg = AutoConfig.for_model(model_type, **shape, **{k: v for k, v in ids.items() if v is not None})
    cfg.architectures = [arch]
    cfg.dtype = "bfloat16"
    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.", dir=d.parent))
    try:
        cfg.save_pretrained(str(tmp))
        save_tokenizer(tok, tmp)
        (tmp / MARKER).write_text(json.dumps({"preset": name, "weights": "none: the server's own random weights",
                                              "server_args": list(SERVER_ARGS)}, indent=1) + "\n")
        if d.exists():  # a half-written one from an interrupted run
            shutil.rmtree(d)
        os.replace(tmp, d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return d
