"""The ``torch`` kernel backend: torch's own fused operators in place of the
eager op sequences transformers runs. Works on CPU and CUDA, needs nothing
beyond torch; the baseline every other backend has to beat.

Entries:

* ``attention-torch-sliced`` (target ``attention``, proposed when the stack
  has a static cache without CUDA graphs): a decode step's SDPA over the
  cache sliced to the batch's longest valid end instead of the whole padded
  cache (``attention_kernel=torch_sliced``); checked at the mean decode
  context and at a full cache; claimed speed-up cache length / context.

* ``rmsnorm-torch-fused`` (target ``normalization``): transformers' Llama
  RMSNorm (fp32 upcast, mean of squares, rsqrt, scale, cast, weight: five or
  more kernels) -> :func:`torch.nn.functional.rms_norm` (one), switched on
  end to end by ``rmsnorm_impl=torch_fused``. Checked at the workload's
  decode shape ``[batch, 1, hidden]`` and prefill shape ``[batch, input_len,
  hidden]``; tolerance 1e-2 relative L2 and 2e-2 worst element relative to the
  largest (half precision rounding of the output); claimed x1.3 on the op
  (a guess, recorded as unverified).

* ``rmsnorm-torch-fused`` for an image pipeline (``framework: diffusers``):
  the denoiser's eager q/k RMSNorms (diffusers' ``RMSNorm``, same numerics),
  checked at the workload's rows (batch x heads x tokens, ``head_dim`` wide);
  proposed only when the denoiser has them (``qk_norm: rms_norm``).

* ``torch-gate-up`` (target ``gemm``, proposed while ``mlp_kernel`` is
  ``eager``): the Llama MLP's front half, transformers' two GEMMs (gate,
  up) + SiLU + mul -> one GEMM over the concatenated ``[2I, H]`` weight +
  SiLU·mul (``mlp_kernel=torch_gate_up``; the engine releases the separate
  weights). Checked at the decode shape (``tokens`` = batch) and a prefill
  chunk (``tokens`` = batch x input_len, at most 256); tolerance per dtype
  (the GEMM's, SiLU's and the product's roundings, as transformers has them);
  claimed x1.1 on the op (a guess: at decode both read the same weight bytes,
  one launch and one weight pass fewer).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from inferloom.frameworks import described
from inferloom.kernels.base import KernelCandidate, Target, model_config, no_image_op as _no_image_op
from inferloom.kernels.torch_ops import decode_reference, fused_rmsnorm, gate_up_silu_torch, sliced_decode
from inferloom.models.decode_shapes import mean_decode_context
from inferloom.models.presets import parse_dtype

__all__ = ["TorchBackend", "rmsnorm_eager", "rmsnorm_reference", "rmsnorm_inputs", "model_dims",
           "gate_up_inputs", "gate_up_eager", "gate_up_reference", "GATE_UP_TOLERANCE"]

_EPS = 1e-5
PREFILL_TOKENS_CHECKED = 256  # the prefill shape's token count is capped: the float64 reference is [tokens, 2I]
GATE_UP_TOLERANCE = {"float32": {"rel_l2": 1e-5, "max_rel": 1e-4},
                     "float16": {"rel_l2": 3e-3, "max_rel": 1e-2},
                     "bfloat16": {"rel_l2": 1e-2, "max_rel": 3e-2}}


def model_dims(model: str) -> dict[str, int]:
    """Sizes of a preset or local model directory (config.json): hidden,
    heads, kv_heads, head_dim."""
    cfg = model_config(model)
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    return {"hidden": hidden, "heads": heads, "kv_heads": int(cfg.get("num_key_value_heads", heads)),
            "head_dim": int(cfg.get("head_dim") or hidden // heads)}


def attention_inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int) -> tuple[dict[str, Any], Any]:
    """A decode step over a static cache of ``cache_len`` slots: every row ends
    at ``context``; rows start at a random left-padding offset (< context / 4)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(int(seed))
    dt = parse_dtype(dtype)
    b, hq, hkv, d, s, ctx = (shape[k] for k in ("batch", "heads", "kv_heads", "head_dim", "cache_len", "context"))
    q = torch.randn(b, hq, 1, d, generator=g).to(device=device, dtype=dt)
    k = torch.randn(b, hkv, s, d, generator=g).to(device=device, dtype=dt)
    v = torch.randn(b, hkv, s, d, generator=g).to(device=device, dtype=dt)
    start = torch.randint(0, max(1, ctx // 4), (b,), generator=g).to(device)
    end = torch.full((b,), ctx, dtype=torch.int64).to(device)
    idx = torch.arange(s, device=device)
    mask = ((idx[None, :] >= start[:, None]) & (idx[None, :] < end[:, None]))[:, None, None, :]
    return ({"query": q, "key": k, "value": v, "start": start, "end": end, "scale": d ** -0.5, "mask": mask},
            torch.empty_like(q))


def attention_hf_sdpa(query: Any, key: Any, value: Any, start: Any, end: Any, scale: float, mask: Any) -> Any:
    """transformers' SDPA path for a masked GQA decode step: repeat K/V to the
    query heads, SDPA over the whole padded cache with the boolean mask."""
    import torch

    rep = query.shape[1] // key.shape[1]
    k = key if rep == 1 else key.repeat_interleave(rep, dim=1)
    v = value if rep == 1 else value.repeat_interleave(rep, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scale)


def _attention_reference(query: Any, key: Any, value: Any, start: Any, end: Any, scale: float, mask: Any) -> Any:
    return decode_reference(query, key, value, start, end, scale)


def _sliced_into(query: Any, key: Any, value: Any, start: Any, end: Any, scale: float, mask: Any, out: Any) -> Any:
    out.copy_(_sliced(query, key, value, start, end, scale, mask))
    return out


def _sliced(query: Any, key: Any, value: Any, start: Any, end: Any, scale: float, mask: Any) -> Any:
    """The candidate as the engine runs it (its result returned, no copy into ``out``: what the gate times)."""
    return sliced_decode(query, key, value, start, end, scale)


def gate_up_inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int) -> tuple[dict[str, Any], Any]:
    """``x`` ``[tokens, hidden]`` ~ N(0, 1) and ``w_gate_up`` = ``[Wg; Wu]``
    ``[2 intermediate, hidden]`` ~ N(0, 1/hidden), as the engine fuses it."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(int(seed))
    dt = parse_dtype(dtype)
    m, h, i = (int(shape[k]) for k in ("tokens", "hidden", "intermediate"))
    x = torch.randn(m, h, generator=g).to(device=device, dtype=dt)
    w = (torch.randn(2 * i, h, generator=g) * h ** -0.5).to(device=device, dtype=dt)
    return {"x": x, "w_gate_up": w}, torch.empty(m, i, device=device, dtype=dt)


def gate_up_eager(x: Any, w_gate_up: Any) -> Any:
    """transformers' LlamaMLP front half: ``act_fn(gate_proj(x)) * up_proj(x)``,
    two GEMMs over the separate (here: row blocks of the fused) weights."""
    import torch.nn.functional as F

    i = w_gate_up.shape[0] // 2
    return F.silu(F.linear(x, w_gate_up[:i])) * F.linear(x, w_gate_up[i:])


def gate_up_reference(x: Any, w_gate_up: Any) -> Any:
    """The truth in float64."""
    import torch

    i = w_gate_up.shape[0] // 2
    y = x.to(torch.float64) @ w_gate_up.to(torch.float64).t()
    return torch.nn.functional.silu(y[:, :i]) * y[:, i:]


def _gate_up_into(x: Any, w_gate_up: Any, out: Any) -> Any:
    out.copy_(_gate_up(x, w_gate_up))
    return out


def _gate_up(x: Any, w_gate_up: Any) -> Any:
    """The candidate as the engine runs it (what the gate times)."""
    return gate_up_silu_torch(x, w_gate_up, w_gate_up.shape[0] // 2)


def gate_up_shapes(workload: Mapping[str, Any]) -> tuple[dict[str, int], ...] | None:
    """The decode shape (timed) and a prefill chunk, or None when the model's
    config has no ``intermediate_size`` (not a Llama-style MLP)."""
    cfg = model_config(str(workload["model"]))
    if not cfg.get("intermediate_size"):
        return None
    b = int(workload["batch"])
    dims = {"hidden": int(cfg["hidden_size"]), "intermediate": int(cfg["intermediate_size"])}
    prefill = min(b * int(workload["input_len"]), PREFILL_TOKENS_CHECKED)
    return ({"tokens": b, **dims}, {"tokens": prefill, **dims})


def rmsnorm_inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int) -> tuple[dict[str, Any], Any]:
    import torch

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
        fw = described(workload.get("framework"))
        if fw is None or not fw.kernel_engine:  # not an in-process engine whose modules a backend rewrites
            return (f"the torch backend rewrites the transformers and diffusers engines' modules, not "
                    f"{workload.get('framework')}")
        return _no_image_op(workload)

    def rewritable(self) -> frozenset[str]:
        return frozenset({"normalization", "attention", "gemm"})

    def propose(self, targets: Sequence[Target], workload: Mapping[str, Any]) -> list[KernelCandidate]:
        picked = {t.category for t in targets if t.picked}
        fw = described(workload.get("framework"))
        if fw is not None and fw.image:
            return self._image(picked, workload)
        out: list[KernelCandidate] = []
        if "normalization" in picked and workload.get("stack", {}).get("rmsnorm_impl", "eager") == "eager":
            hidden = model_dims(str(workload["model"]))["hidden"]
            b = int(workload["batch"])
            shapes = ({"batch": b, "seq": 1, "hidden": hidden},
                      {"batch": b, "seq": int(workload["input_len"]), "hidden": hidden})
            out.append(KernelCandidate(
                id="rmsnorm-torch-fused", target="normalization", op="LlamaRMSNorm.forward (eager, 5+ ops)",
                implementation=_fused_into, timed=fused_rmsnorm, baseline=rmsnorm_eager, reference=rmsnorm_reference,
                make_inputs=rmsnorm_inputs, shapes=shapes, dtype=str(workload["dtype"]), claimed_speedup=1.3,
                config_changes={"rmsnorm_impl": "torch_fused"},
                tolerance={"rel_l2": 1e-2, "max_rel": 2e-2},
                notes="torch.nn.functional.rms_norm in fp32, cast back, then the weight: transformers' order"))
        stack = workload.get("stack", {})
        if ("attention" in picked and stack.get("attention_kernel", "sdpa") == "sdpa"
                and stack.get("cache_implementation") == "static" and stack.get("compile_mode") != "reduce-overhead"
                and stack.get("attn_implementation", "sdpa") == "sdpa"):
            dims = model_dims(str(workload["model"]))
            cache = int(workload["input_len"]) + int(workload["output_len"])
            ctx = int(round(mean_decode_context(int(workload["input_len"]), int(workload["output_len"]))))
            shape = {"batch": int(workload["batch"]), "heads": dims["heads"], "kv_heads": dims["kv_heads"],
                     "head_dim": dims["head_dim"], "cache_len": cache, "context": min(ctx, cache)}
            out.append(KernelCandidate(
                id="attention-torch-sliced", target="attention",
                op="transformers SDPA decode step over the whole padded static cache",
                implementation=_sliced_into, timed=_sliced, baseline=attention_hf_sdpa, reference=_attention_reference,
                make_inputs=attention_inputs, shapes=(shape, {**shape, "context": cache}),
                dtype=str(workload["dtype"]), claimed_speedup=cache / max(1, shape["context"]),
                config_changes={"attention_kernel": "torch_sliced"},
                covers=("memory_copy", "elementwise"),  # repeat_kv's copy of the cache (eager / inductor kernel)
                tolerance={"rel_l2": 2e-2, "max_rel": 5e-2},
                notes="reads the cache only up to the batch's longest valid end; claim = cache / context (guess)"))
        shapes = gate_up_shapes(workload) if "gemm" in picked and stack.get("mlp_kernel", "eager") == "eager" else None
        if shapes is not None:
            dtype = str(workload["dtype"])
            out.append(KernelCandidate(
                id="torch-gate-up", target="gemm",
                op="LlamaMLP: act_fn(gate_proj(x)) * up_proj(x) (two GEMMs + SiLU + mul)",
                implementation=_gate_up_into, timed=_gate_up, baseline=gate_up_eager, reference=gate_up_reference,
                make_inputs=gate_up_inputs, shapes=shapes, dtype=dtype, claimed_speedup=1.1,
                config_changes={"mlp_kernel": "torch_gate_up"},
                tolerance=dict(GATE_UP_TOLERANCE.get(dtype, GATE_UP_TOLERANCE["bfloat16"])),
                notes="one GEMM over the concatenated [2I, H] weight, then SiLU·mul; claim x1.1 (guess)"))
        return out

    def _image(self, picked: set[str], workload: Mapping[str, Any]) -> list[KernelCandidate]:
        """An image pipeline: the denoiser's eager q/k RMSNorms (when it has any), at the workload's rows."""
        d = workload.get("diffusion") or {}
        if ("normalization" not in picked or not d.get("rmsnorms")
                or workload.get("stack", {}).get("rmsnorm_impl", "eager") != "eager"):
            return []
        shape = {"batch": 1, "seq": int(d["rms_rows"]), "hidden": int(d["head_dim"])}
        return [KernelCandidate(
            id="rmsnorm-torch-fused", target="normalization", op="diffusers RMSNorm.forward (eager q/k norm, 5+ ops)",
            implementation=_fused_into, timed=fused_rmsnorm, baseline=rmsnorm_eager, reference=rmsnorm_reference,
            make_inputs=rmsnorm_inputs, shapes=(shape, {**shape, "seq": min(shape["seq"], 64)}),
            dtype=str(workload["dtype"]), claimed_speedup=1.3, config_changes={"rmsnorm_impl": "torch_fused"},
            tolerance={"rel_l2": 1e-2, "max_rel": 2e-2},
            notes=f"{d['rmsnorms']} modules; F.rms_norm in fp32, cast back, then the weight: diffusers' order")]
