"""The ``torch`` kernel backend: torch's own fused operators in place of the
eager op sequences transformers runs. Works on CPU and CUDA, needs nothing
beyond torch; the baseline every other backend has to beat.

Entries:

* ``rmsnorm-torch-fused`` (target ``normalization``): transformers' Llama
  RMSNorm (fp32 upcast, mean of squares, rsqrt, scale, cast, weight: five or
  more kernels) -> :func:`torch.nn.functional.rms_norm` (one), switched on
  end to end by ``rmsnorm_impl=torch_fused``. Checked at the workload's
  decode shape ``[batch, 1, hidden]`` and prefill shape ``[batch, input_len,
  hidden]``; tolerance 1e-2 relative L2 and 2e-2 worst element relative to the
  largest (half precision rounding of the output); claimed x1.3 on the op
  (a guess, recorded as unverified).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from inferloom.kernels.apply import fused_rmsnorm
from inferloom.kernels.base import KernelCandidate, Target

__all__ = ["TorchBackend", "rmsnorm_eager", "rmsnorm_reference", "rmsnorm_inputs", "model_dims"]

_EPS = 1e-5


def model_dims(model: str) -> dict[str, int]:
    """hidden size of a preset or local model directory (config.json)."""
    from inferloom.models.presets import PRESETS

    if model in PRESETS:
        cfg = PRESETS[model]
        return {"hidden": int(cfg["hidden_size"])}
    import json
    from pathlib import Path

    return {"hidden": int(json.loads((Path(model) / "config.json").read_text())["hidden_size"])}


def rmsnorm_inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int) -> tuple[dict[str, Any], Any]:
    import torch

    from inferloom.models.presets import parse_dtype

    g = torch.Generator(device="cpu").manual_seed(int(seed))
    dt = parse_dtype(dtype)
    x = torch.randn(shape["batch"], shape["seq"], shape["hidden"], generator=g).to(device=device, dtype=dt)
    w = (1.0 + 0.1 * torch.randn(shape["hidden"], generator=g)).to(device=device, dtype=dt)
    return {"hidden_states": x, "weight": w, "eps": _EPS}, torch.empty_like(x)


def rmsnorm_eager(hidden_states: Any, weight: Any, eps: float) -> Any:
    """transformers' LlamaRMSNorm.forward, op for op (the op being replaced)."""
    import torch

    dt = hidden_states.dtype
    h = hidden_states.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return weight * h.to(dt)


def rmsnorm_reference(hidden_states: Any, weight: Any, eps: float) -> Any:
    """The truth in float64."""
    import torch

    h = hidden_states.to(torch.float64)
    return weight.to(torch.float64) * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))


def _fused_into(hidden_states: Any, weight: Any, eps: float, out: Any) -> Any:
    out.copy_(fused_rmsnorm(hidden_states, weight, eps))
    return out


class TorchBackend:
    """See the module docstring."""

    name = "torch"

    def unavailable(self, workload: Mapping[str, Any]) -> str | None:
        if workload.get("framework") != "transformers":
            return f"the torch backend rewrites the transformers engine's modules, not {workload.get('framework')}"
        return None

    def rewritable(self) -> frozenset[str]:
        return frozenset({"normalization"})

    def propose(self, targets: Sequence[Target], workload: Mapping[str, Any]) -> list[KernelCandidate]:
        picked = {t.category for t in targets if t.picked}
        out: list[KernelCandidate] = []
        if "normalization" in picked and workload.get("stack", {}).get("rmsnorm_impl", "eager") == "eager":
            hidden = model_dims(str(workload["model"]))["hidden"]
            b = int(workload["batch"])
            shapes = ({"batch": b, "seq": 1, "hidden": hidden},
                      {"batch": b, "seq": int(workload["input_len"]), "hidden": hidden})
            out.append(KernelCandidate(
                id="rmsnorm-torch-fused", target="normalization", op="LlamaRMSNorm.forward (eager, 5+ ops)",
                implementation=_fused_into, baseline=rmsnorm_eager, reference=rmsnorm_reference,
                make_inputs=rmsnorm_inputs, shapes=shapes, dtype=str(workload["dtype"]), claimed_speedup=1.3,
                config_changes={"rmsnorm_impl": "torch_fused"},
                tolerance={"rel_l2": 1e-2, "max_rel": 2e-2},
                notes="torch.nn.functional.rms_norm in fp32, cast back, then the weight: transformers' order"))
        return out
