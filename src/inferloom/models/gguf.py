"""A GGUF file as a model: converted once into the inferloom cache.

``model: path/to/file.gguf`` in a spec (transformers and vllm frameworks) names
a GGUF file (llama.cpp's format: one file with the weights, usually quantized,
the config and the tokenizer). Neither engine of inferloom runs it as it is:
it is **converted once** into a Hugging Face model directory in the cache,

    $INFERLOOM_CACHE/models/<sha256 of the file>/   (default ~/.cache/inferloom)

by transformers (``from_pretrained(dir, gguf_file=name)`` dequantizes the
weights; a fresh model of the same class, built from its config, takes the
state dict and is saved in bfloat16 with ``save_pretrained``; the tokenizer and
chat template, from the GGUF too, are saved beside it). The directory is
written under a temporary name and renamed when complete, so it is either
whole or absent; its marker file (:data:`MARKER`) records the source's sha256,
and a later resolve of the same file (same sha256) reuses it without
converting. The manifest's pins record the marker (the source file and its
hash) beside the converted files' hashes (``inferloom.pins``).

Before anything is converted the file's header is read by :func:`inspect_gguf`
(no weights are read): a file that is not GGUF, is truncated (a tensor's data
ends past the end of the file: that tensor is named), or holds an architecture
transformers can't load is refused with one :class:`GGUFError` line naming the
file and the tensor or architecture; a conversion that fails later leaves
nothing in the cache either.

Progress lines for the long steps (hashing, dequantizing, saving) go to stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from pathlib import Path
from typing import Any, BinaryIO, Callable

from inferloom.errors import InferloomError
from inferloom.models.tokenizer import cache_root
from inferloom.pins import SOURCE_MARKER, cached_file_sha256, file_sha256

__all__ = ["GGUFError", "MARKER", "models_cache", "inspect_gguf", "is_gguf_path", "converted_dir", "read_marker",
           "convert_gguf"]

#: the marker file of a converted directory: the source's sha256 (written last, before the rename)
MARKER = SOURCE_MARKER
_SCHEMA = 1
_MAGIC = b"GGUF"
# GGUF metadata value types: fixed sizes (struct formats); 8 = string, 9 = array
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_MAX_COUNT = 1 << 32  # more tensors / keys / array items than this: not a sane header


class GGUFError(InferloomError, ValueError):
    """A GGUF file that can't be converted: one line naming the file and the tensor or architecture."""


def _stderr(msg: str) -> None:
    print(f"inferloom: {msg}", file=sys.stderr, flush=True)


def models_cache() -> Path:
    """``$INFERLOOM_CACHE/models`` (default ``~/.cache/inferloom/models``): converted models by source sha256."""
    return cache_root() / "models"


def is_gguf_path(value: str) -> bool:
    return value.lower().endswith(".gguf")


class _Header:
    def __init__(self, fh: BinaryIO, name: str) -> None:
        self.fh, self.name = fh, name

    def read(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        raw = self.fh.read(size)
        if len(raw) != size:
            raise GGUFError(f"{self.name}: truncated in its header (at byte {self.fh.tell()}); "
                            "the file is damaged or incomplete")
        return struct.unpack("<" + fmt, raw)[0]

    def count(self, what: str) -> int:
        n = self.read("Q")
        if n > _MAX_COUNT:
            raise GGUFError(f"{self.name}: header says {n} {what}; the file is damaged")
        return n

    def string(self) -> str:
        n = self.count("bytes in a string")
        raw = self.fh.read(n)
        if len(raw) != n:
            raise GGUFError(f"{self.name}: truncated in its header (at byte {self.fh.tell()}); "
                            "the file is damaged or incomplete")
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _FIXED:
            return self.read(_FIXED[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            itype, n = self.read("I"), self.count("array items")
            if itype in _FIXED:  # skipped, not decoded: a vocabulary's scores are large
                self.fh.seek(n * struct.calcsize("<" + _FIXED[itype]), os.SEEK_CUR)
                return None
            for _ in range(n):
                self.value(itype)
            return None
        raise GGUFError(f"{self.name}: unknown metadata value type {vtype} at byte {self.fh.tell()}; "
                        "the file is damaged")


def inspect_gguf(path: str | Path) -> dict[str, Any]:
    """The architecture, tensor count, version and whether it carries a chat template
    (``tokenizer.chat_template``) of a GGUF file from its header alone
    (weights unread); :class:`GGUFError` when it is not GGUF, is truncated (the first
    tensor whose data ends past the file's end is named) or its architecture is one
    transformers can't load."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    p = Path(path)
    name = str(p)
    if not p.is_file():
        raise GGUFError(f"{name}: no such file; expected a .gguf model file")
    size = p.stat().st_size
    with open(p, "rb") as fh:
        h = _Header(fh, name)
        if fh.read(4) != _MAGIC:
            raise GGUFError(f"{name}: not a GGUF file (no GGUF magic in its first bytes)")
        version = h.read("I")
        if version not in (2, 3):
            raise GGUFError(f"{name}: GGUF version {version} is not supported (expected 2 or 3)")
        n_tensors, n_kv = h.count("tensors"), h.count("metadata keys")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = h.string()
            meta[key] = h.value(h.read("I"))
        tensors = []
        for _ in range(n_tensors):
            tname = h.string()
            dims = [h.read("Q") for _ in range(h.read("I"))]
            ttype, offset = h.read("I"), h.read("Q")
            tensors.append((tname, dims, ttype, offset))
        align = int(meta.get("general.alignment") or 32)
        data_start = -(-fh.tell() // align) * align
    for tname, dims, ttype, offset in tensors:
        try:
            block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (KeyError, ValueError):
            raise GGUFError(f"{name}: tensor {tname} has unknown type {ttype}; the file is damaged or "
                            "newer than the installed gguf package") from None
        n = 1
        for d in dims:
            n *= d
        end = data_start + offset + n // block * nbytes
        if end > size:
            raise GGUFError(f"{name}: tensor {tname} ends at byte {end}, past the end of the file ({size} "
                            "bytes); the file is truncated")
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFError(f"{name}: no general.architecture in its metadata; not a model GGUF")
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    if arch not in GGUF_CONFIG_MAPPING or arch in ("general", "tokenizer"):
        known = ", ".join(sorted(k for k in GGUF_CONFIG_MAPPING if k not in ("general", "tokenizer")))
        raise GGUFError(f"{name}: architecture {arch!r} is not supported by transformers' GGUF loader "
                        f"(supported: {known})")
    # without its shape, transformers would build its config's default model (a 7B Llama for llama): refused
    for key in ("block_count", "embedding_length", "attention.head_count", "feed_forward_length"):
        if key in GGUF_CONFIG_MAPPING[arch] and not isinstance(meta.get(f"{arch}.{key}"), int):
            raise GGUFError(f"{name}: no {arch}.{key} in its metadata; not a complete {arch} model")
    if "tokenizer.ggml.model" not in meta:
        raise GGUFError(f"{name}: no tokenizer (tokenizer.ggml.model) in its metadata; the converted model needs one")
    return {"architecture": arch, "tensors": len(tensors), "version": version, "bytes": size,
            "name": meta.get("general.name"), "chat_template": bool(meta.get("tokenizer.chat_template"))}


def converted_dir(sha256: str) -> Path:
    return models_cache() / sha256


def read_marker(directory: str | Path) -> dict[str, Any] | None:
    """The marker of a converted directory (None when it has none or it is unreadable)."""
    try:
        data = json.loads((Path(directory) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("source_sha256"), str) else None


def _complete(directory: Path, sha256: str) -> bool:
    marker = read_marker(directory)
    return marker is not None and marker["source_sha256"] == sha256 and (directory / "config.json").is_file()


def convert_gguf(path: str | Path, *, expected_sha256: str | None = None, source: str | None = None,
                 progress: Callable[[str], None] | None = None) -> Path:
    """The converted directory of GGUF file ``path`` (see the module docstring),
    converting it the first time. ``expected_sha256``: refuse a file with another
    hash; ``source``: what the marker records as where the file came from."""
    say = progress or _stderr
    p = Path(path).expanduser().resolve()
    info = inspect_gguf(p)
    say(f"hashing {p} ({info['bytes'] / 1e6:.0f} MB)")
    sha = file_sha256(p) if expected_sha256 is not None else cached_file_sha256(p)  # a fetch's file is temporary
    if expected_sha256 is not None and sha != expected_sha256:
        raise GGUFError(f"{p}: sha256 {sha} is not the expected {expected_sha256}; the file is damaged or "
                        "not the one this model names")
    final = converted_dir(sha)
    if _complete(final, sha):
        return final
    models_cache().mkdir(parents=True, exist_ok=True)
    tmp = models_cache() / f".tmp-{sha[:16]}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _convert_into(p, tmp, say)
        marker = {"schema_version": _SCHEMA, "kind": "gguf", "source_sha256": sha, "source_path": str(p),
                  "source": source or str(p), "source_bytes": info["bytes"], "gguf_architecture": info["architecture"],
                  "dtype": "bfloat16", "converted_with": _versions()}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True))
        if final.exists() and not _complete(final, sha):
            shutil.rmtree(final)  # a directory of an older, broken attempt (no valid marker)
        try:
            os.rename(tmp, final)
        except OSError:
            if not _complete(final, sha):  # not another process's finished conversion
                raise
    except GGUFError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the converter: one line, nothing left
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise GGUFError(f"{p}: transformers could not convert it ({type(exc).__name__}: {first[:300]})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"converted model in {final}")
    return final


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("transformers", "gguf", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _convert_into(src: Path, out: Path, say: Callable[[str], None]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say(f"dequantizing {src.name} with transformers (once; the result is cached)")
    loaded, loading = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32,
                                                           output_loading_info=True)
    tied = set(getattr(loaded, "_tied_weights_keys", None) or ())
    missing = sorted(k for k in loading.get("missing_keys", ()) if k not in tied)
    if missing:  # transformers would fill it with random weights
        raise GGUFError(f"{src}: tensor {missing[0]} of {type(loaded).__name__} is not in the file"
                        + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""))
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config  # the saved weights are plain bf16
    cfg.architectures = [type(loaded).__name__]
    cfg.dtype = torch.bfloat16
    cls, gen = type(loaded), loaded.generation_config
    state = {k: v.to(torch.bfloat16) for k, v in loaded.state_dict().items()}
    del loaded
    prev = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.bfloat16)
        fresh = cls(cfg)  # a plain model of the same class: its save_pretrained takes no GGUF state
    finally:
        torch.set_default_dtype(prev)
    result = fresh.load_state_dict(state, strict=False)
    tied = set(getattr(fresh, "_tied_weights_keys", None) or ())
    missing = [k for k in result.missing_keys if k not in tied]
    if missing:
        raise GGUFError(f"{src}: tensor {missing[0]} of {cls.__name__} is not in the file")
    say(f"saving {len(state)} tensors in bfloat16 to the cache")
    out.mkdir(parents=True)
    fresh.save_pretrained(str(out))
    if gen is not None:
        gen.save_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    tok.save_pretrained(str(out))
