"""Workload spec: a YAML file and the same fields as CLI flags, validated.

Every validation problem becomes one :class:`SpecError` whose message is a
single line naming the key and what was expected (the CLI prints it and exits
with code 2, no traceback).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator

from inferloom.errors import InferloomError
from inferloom.inputs import InputError, load_yaml
from inferloom.models.diffusion_presets import DIFFUSION_PRESETS
from inferloom.spec.custom import CustomKnob, CustomSpec, PatchPolicySpec
from inferloom.spec.quality import NumericsToleranceSpec, TaskGateSpec
from inferloom.spec.diffusion import DiffusionSpec
from inferloom.spec.engine_patches import check_engine_patches
from inferloom.spec.fields import _n, _Strict, check_bounds, field_default
from inferloom.spec.llm import AgentsSpec, LLMSpec
from inferloom.spec.model import MODEL_HELP, resolve_model
from inferloom.spec.paths import resolve_override, resolve_spec_paths
from inferloom.spec.serving import check_extra_args, check_ladder_dir, check_serving_env
from inferloom.spec.traffic import REQUESTS_PER_CONCURRENCY, Traffic

__all__ = [
    "SpecError", "objective_label", "Traffic", "QualitySpec", "ProtocolSpec", "ServingSpec",
    "WorkloadSpec", "CustomKnob", "CustomSpec", "PatchPolicySpec", "load_spec", "spec_hash",
    "KernelSpec", "TaskGateSpec", "NumericsToleranceSpec", "field_default", "check_bounds", "REQUESTS_PER_CONCURRENCY",
    "AgentsSpec", "LLMSpec", "DiffusionSpec",
]


class SpecError(InferloomError, ValueError):
    """A bad spec: the message is one line naming the key and what was expected."""


#: the frameworks whose adapter answers the task gate's items (``quality.task``): the model's own
#: tokenizer and a greedy generation path (in process, or through the server's completions)
_TASK_GATE_FRAMEWORKS = ("transformers", "vllm", "sglang")
#: the server frameworks: the load generator drives them (goodput, traces)
_SERVER_FRAMEWORKS = ("vllm", "sglang")
#: each server framework's ``serving.module`` when the spec names none
_SERVER_MODULES = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}


class QualitySpec(_Strict):
    """The quality contract. Defaults are justified in docs/quality.md."""

    eval_prompts: int = _n(8, 1, 1024, "prompts of the eval set")
    heldout_prompts: int = _n(8, 1, 1024, "prompts of the held-out set")
    prompt_len: int = _n(32, 1, 8192, "tokens per quality prompt")
    continuation_len: int = _n(32, 1, 4096, "greedy tokens compared per quality prompt")
    concurrency: int = _n(1, 1, 1024, "server frameworks (vllm): quality-probe requests in flight at once, one "
                          "prompt each; 1 (the default) computes each prompt alone, so the batches a server forms "
                          "never depend on timing (docs/quality.md, 'Batch composition')")
    prompts_file: str | None = Field(None, description="JSONL texts; default random token ids")
    chat_template: bool = Field(False, description="quality.prompts_file holds {\"messages\": [...]} lines, rendered "
                                "with the model's chat template (each probe keeps a chat's last prompt_len tokens)")
    min_top1_agreement: float = Field(0.98, ge=0.0, le=1.0)
    max_mean_kl: float = Field(0.01, ge=0.0)
    min_greedy_agreement: float = Field(0.8, ge=0.0, le=1.0)
    tie_margin: float = Field(0.1, ge=0.0, description="nats: a flip between tokens this close in stock's log-probs is a tie-break")
    task: TaskGateSpec | None = Field(None, description="optional task-accuracy gate (docs/quality.md)")
    numerics: NumericsToleranceSpec | None = Field(None, description="optional tolerance for numerics-changing candidates")
    # images (framework: diffusers): each image against stock's on the same prompt and noise seed
    min_psnr_db: float = _n(35.0, 0.0, 200.0, "images: the lowest PSNR (dB) of a decoded image vs stock's allowed")
    min_ssim: float = Field(0.98, ge=-1.0, le=1.0, description="images: the lowest SSIM of a decoded image vs stock's allowed")
    max_latent_rel_err: float = _n(0.03, 0.0, 100.0, "images: the largest relative L2 error of a final latent vs stock's "
                                   "allowed")

    @field_validator("prompts_file")
    @classmethod
    def _pf(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_file():
            raise ValueError(f"file {v} not found; expected an existing .jsonl file of texts")
        return v

    @field_validator("chat_template")
    @classmethod
    def _chat(cls, v: bool, info: ValidationInfo) -> bool:
        if v and "prompts_file" in info.data and info.data["prompts_file"] is None:
            raise ValueError("true needs quality.prompts_file: a .jsonl file of {\"messages\": [...]} lines")
        return v


class ProtocolSpec(_Strict):
    """The measurement protocol (docs/protocol.md). ``design: sequential`` (the default) is the
    group-sequential trimmed-t design with a noise-following pair budget; ``bonferroni`` the earlier
    design (Bonferroni looks, bootstrap + t interval), which results written before it name implicitly."""

    design: Literal["sequential", "bonferroni"] = Field(
        "sequential", description="decision design: sequential (error spending, budget, futility) or bonferroni")
    min_gain: float = Field(0.01, ge=0.0, lt=1.0, description="minimum relative gain to keep")
    confidence: float = Field(0.98, gt=0.5, lt=1.0, description="two-sided level; a keep's error is (1 - confidence) / 2")
    min_pairs: int = _n(6, 3, 200, "interleaved pairs before the first decision")
    max_pairs: int = _n(30, 3, 200, "interleaved pairs at most (then inconclusive)")
    pair_step: int = _n(4, 1, 100, "pairs added between decisions")
    target_gain: float = Field(0.03, gt=0.0, lt=1.0, description="sequential: the gain the pair budget is sized to "
                               "keep with probability `power`; futility stops once it is out of reach")
    power: float = Field(0.9, ge=0.5, lt=1.0, description="sequential: power at target_gain the budget is sized for")
    futility_error: float = Field(0.05, ge=0.0, lt=0.5, description="sequential: at most this probability of a "
                                  "futility stop at a true gain of target_gain")
    trim: float = Field(0.05, ge=0.0, le=0.25, description="sequential: share trimmed from each end of the log-ratios")
    harm_ratio: float = Field(0.5, ge=0.0, lt=1.0, description="sequential: revert before min_pairs when every pair "
                              "so far (2 at least) is below this ratio and far below 1 for the A/A's noise (harm stop; "
                              "it never keeps; 0 disables)")
    spending_power: float = _n(4.0, 0.5, 10.0, "sequential: error spent by information fraction t is t^this")
    jit_remeasures: int = _n(2, 0, 10, "pairs measured again, per comparison, because a server's log said it "
                             "JIT-compiled during one of their runs (warm-up; then every pair counts; 0: off)")
    warmup_runs: int = _n(1, 1, 100, "untimed runs per configuration first")
    bootstrap_resamples: int = _n(4999, 199, 100_000, "bootstrap resamples of the interval (bonferroni design)")
    bootstrap_seed: int = _n(12345, 0, 2**32 - 1, "seed of the bootstrap (bonferroni design)")

    @model_validator(mode="after")
    def _pairs(self) -> "ProtocolSpec":
        if self.max_pairs < self.min_pairs:
            raise ValueError(f"max_pairs ({self.max_pairs}) is below min_pairs ({self.min_pairs}); "
                             "expected max_pairs >= min_pairs")
        if self.design == "sequential" and self.target_gain <= self.min_gain:
            raise ValueError(f"target_gain ({self.target_gain}) must exceed min_gain ({self.min_gain}) "
                             "for the sequential design")
        return self


class KernelSpec(_Strict):
    backend: Literal["auto", "none", "torch", "catalog", "plugin"] = Field(
        "auto", description="KERNEL phase backend: auto (catalog on CUDA, torch on CPU, none for the synthetic "
        "adapter and for servers), none (skip the phase), torch (torch's fused ops), catalog (inferloom's Triton "
        "kernels, CUDA), plugin (a server's own kernel plugins, e.g. vLLM's register_oot replacements: opt-in, "
        "since it keeps kernels.budget_share of the session for them)")
    min_share: float = Field(0.02, ge=0.0, le=1.0, description="a category below this share of the profiled run is not targeted")
    min_speedup: float = _n(1.05, 0.0, 100.0, "microbenchmark speed-up a kernel must reach over the op it replaces "
                            "(below 1 lets a kernel slower on its op through to the end-to-end measurement, which "
                            "alone keeps anything: e.g. the Triton interpreter on a CPU, in tests)", gt=True)
    budget_share: float = Field(
        0.35, ge=0.0, lt=1.0, description="share of the session's budget (wall-clock minutes and trials) kept for "
        "the KERNEL phase when a kernel backend applies: FRAMEWORK ends once the rest is used (0: FRAMEWORK may use "
        "it all)")
    server_profile: Literal["auto", "always", "never"] = Field(
        "auto", description="a server's profile for the KERNEL phase's targets (vLLM's own profiler: one more "
        "server start and a trace, ~1-2 min on a CPU), taken in PRELUDE only when the phase runs the engine's own "
        "backend (backend: plugin): auto (when its estimated cost is at most half the KERNEL phase's budget "
        "share), always (then), never (the backend's fixed order, no Amdahl bound)")


class ServingSpec(_Strict):
    """Server adapters (``framework: vllm``): how the server is launched and
    how the load generator drives it. See docs/loadgen.md and README."""

    python: str = Field("python", description="the server environment's Python (e.g. .venv-vllm/bin/python)")
    module: str = Field("vllm.entrypoints.openai.api_server", description="server module run with python -m")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for the server process")
    extra_args: list[str] = Field(default_factory=list, description="extra server arguments, every candidate")
    startup_timeout_s: float = _n(300.0, 0, 86400, "seconds for the server to become ready", gt=True)
    request_timeout_s: float = _n(300.0, 0, 86400, "seconds for one request", gt=True)
    max_model_len: int | None = _n(None, 16, 1 << 20, "the server's context length")
    arrival: Literal["concurrency", "poisson"] = "concurrency"
    request_rate: float | None = _n(None, 0, 1e6, "req/s for poisson arrivals", gt=True)
    warmup_requests: int | None = _n(None, 0, 100_000, "untimed requests first (default concurrency)")
    prefix: Literal["fresh", "shared"] = Field("fresh", description="fresh prompts per run, or a declared shared prefix")
    shared_prefix_len: int = _n(0, 0, 131072, "tokens of the declared shared prefix")
    slo_ttft_ms: float | None = _n(None, 0, 3.6e6, "time-to-first-token SLO, ms", gt=True)
    slo_tpot_ms: float | None = _n(None, 0, 3.6e6, "time-per-output-token SLO, ms", gt=True)
    slo_e2el_ms: float | None = _n(None, 0, 3.6e6, "end-to-end latency SLO, ms", gt=True)
    engine_patches: str | None = Field(None, description="framework: vllm: a directory of engine diffs (.patch / "
                                       ".diff against vllm/..., e.g. upstream pull requests): each a FRAMEWORK "
                                       "candidate through a copy-on-write overlay of the installed package "
                                       "(docs/kernels.md); when stock fails to start, the enablement ladder's rungs 3 "
                                       "(in-tree) and 5 (upstream-* or 'Origin: upstream') (docs/enablement.md)")
    wheelhouse: str | None = Field(
        None, description="a directory of wheels: the enablement ladder's rung 4 installs them (pip --no-index "
        "--only-binary :all:) into a virtualenv of its own and starts the server with its python (docs/enablement.md)")

    _env_ok = field_validator("env")(classmethod(lambda cls, v: check_serving_env(v)))
    _args_ok = field_validator("extra_args")(classmethod(lambda cls, v: check_extra_args(v)))
    _patches_ok = field_validator("engine_patches")(classmethod(lambda cls, v: check_engine_patches(v)))
    _wheels_ok = field_validator("wheelhouse")(classmethod(lambda cls, v: check_ladder_dir(v, "wheelhouse")))


class WorkloadSpec(_Strict):
    model: str = Field("llama-tiny", description=MODEL_HELP)
    framework: Literal["transformers", "synthetic", "custom", "vllm", "diffusers", "sglang"] = "transformers"
    device: Literal["cpu", "cuda", "auto"] = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    seed: int = _n(0, 0, 2**31 - 1, "seed of prompts, searches and adapters")
    objective: Literal["output_tokens_per_s", "goodput"] = "output_tokens_per_s"
    traffic: Traffic = Traffic()
    quality: QualitySpec = QualitySpec()
    protocol: ProtocolSpec = ProtocolSpec()
    kernels: KernelSpec = KernelSpec()
    pinned: dict[str, Any] = Field(default_factory=dict)
    custom: CustomSpec | None = Field(None, description="framework: custom only (docs/custom.md)")
    serving: ServingSpec = ServingSpec()
    agents: AgentsSpec = AgentsSpec()
    diffusion: DiffusionSpec | None = Field(None, description="framework: diffusers only (docs/diffusers.md); "
                                            "filled with its defaults for framework: diffusers")

    @model_validator(mode="before")
    @classmethod
    def _server_module_default(cls, data: Any) -> Any:
        """``serving.module`` defaults to the server framework's own (SGLang: ``sglang.launch_server``)."""
        framework = data.get("framework") if isinstance(data, dict) else None
        if not isinstance(framework, str) or framework not in _SERVER_MODULES:
            return data
        serving = data.get("serving")
        if serving is None:
            serving = {}
        if isinstance(serving, dict) and "module" not in serving:
            return {**data, "serving": {**serving, "module": _SERVER_MODULES[framework]}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _diffusion_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("framework") == "diffusers" and data.get("diffusion") is None:
            return {**data, "diffusion": {}}
        return data

    @model_validator(mode="after")
    def _diffusers(self) -> "WorkloadSpec":
        image_model = self.model in DIFFUSION_PRESETS or (Path(self.model) / "model_index.json").is_file()
        if self.framework == "diffusers" and not image_model:
            raise ValueError("framework 'diffusers' needs a diffusion preset (" + ", ".join(sorted(DIFFUSION_PRESETS))
                             + ") or a local diffusers pipeline directory (with model_index.json)")
        if self.framework != "diffusers" and self.diffusion is not None:
            raise ValueError(f"a 'diffusion' section needs framework: diffusers, got framework: {self.framework}")
        if self.framework != "diffusers" and self.model in DIFFUSION_PRESETS:
            raise ValueError(f"model {self.model} is a diffusion pipeline preset; it needs framework: diffusers")
        return self

    @model_validator(mode="after")
    def _custom(self) -> "WorkloadSpec":
        if self.framework == "custom" and self.custom is None:
            raise ValueError("framework 'custom' needs a 'custom' section (repo, entrypoint, knobs)")
        if self.framework != "custom" and self.custom is not None:
            raise ValueError(f"a 'custom' section needs framework: custom, got framework: {self.framework}")
        return self

    @model_validator(mode="after")
    def _goodput_needs_slo(self) -> "WorkloadSpec":
        s = self.serving
        if self.objective == "goodput" and not (s.slo_ttft_ms or s.slo_tpot_ms or s.slo_e2el_ms):
            raise ValueError("objective goodput needs at least one SLO (serving.slo_ttft_ms, slo_tpot_ms or slo_e2el_ms)")
        if self.objective == "goodput" and self.framework not in _SERVER_FRAMEWORKS:
            raise ValueError("objective goodput needs a server framework (vllm, sglang): only the load generator "
                             "measures it")
        if s.arrival == "poisson" and s.request_rate is None:
            raise ValueError("serving.arrival poisson needs serving.request_rate")
        return self

    @model_validator(mode="after")
    def _engine_patches_only_vllm(self) -> "WorkloadSpec":
        if self.serving.engine_patches is not None and self.framework != "vllm":
            raise ValueError(f"serving.engine_patches needs framework: vllm (patches to the vLLM package), got "
                             f"{self.framework}")
        return self

    @model_validator(mode="after")
    def _trace_only_vllm(self) -> "WorkloadSpec":
        t = self.traffic
        if t.trace is None:
            return self
        if self.framework not in _SERVER_FRAMEWORKS:
            raise ValueError(f"traffic.trace needs a server framework (vllm, sglang: the load generator replays it), "
                             f"got {self.framework}")
        if t.prompts != "random":
            raise ValueError("traffic.trace and traffic.prompts: a trace carries its own lengths (or texts); "
                             "leave traffic.prompts random")
        if self.serving.arrival == "poisson":
            raise ValueError("traffic.trace and serving.arrival poisson: a trace carries its own arrivals")
        if self.serving.prefix == "shared":
            raise ValueError("traffic.trace and serving.prefix shared: a trace replay sends fresh prompts")
        return self

    @model_validator(mode="after")
    def _task_gate_framework(self) -> "WorkloadSpec":
        if self.quality.task is not None and self.framework not in _TASK_GATE_FRAMEWORKS:
            raise ValueError(f"quality.task (the task-accuracy gate) needs framework transformers, vllm or sglang, got "
                             f"{self.framework}: its items are text prompts answered greedily, and only those "
                             "adapters have the model's tokenizer and a greedy generation path (a custom workload "
                             "judges quality with its own quality_gate)")
        return self

    @field_validator("model")
    @classmethod
    def _model(cls, v: str, info: ValidationInfo) -> str:
        return resolve_model(v, convert=bool((info.context or {}).get("convert_models", True)))

    @property
    def requests_per_run(self) -> int:
        """Requests per timed run: ``traffic.num_prompts``, else the framework's
        :data:`REQUESTS_PER_CONCURRENCY` x ``traffic.concurrency``."""
        t = self.traffic
        return t.num_prompts if t.num_prompts is not None else REQUESTS_PER_CONCURRENCY[self.framework] * t.concurrency

    def resolved_device(self) -> str:
        if self.framework == "custom" and self.device == "auto":
            return "cpu"
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _one_line(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(x) for x in e["loc"]) or "spec"
    if e["type"] == "extra_forbidden":
        parent: Any = WorkloadSpec
        for part in e["loc"][:-1]:
            ann = parent.model_fields[str(part)].annotation
            parent = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
            if parent is None:
                break
        allowed = ", ".join(parent.model_fields) if parent else "a known key"
        return f"spec key '{loc}': unknown key, expected one of: {allowed}"
    msg = e["msg"].removeprefix("Value error, ")
    got = e.get("input")
    got_txt = "" if isinstance(got, (dict, list)) else f", got {got!r}"
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"spec key '{loc}': {msg}{got_txt}{more}"


def _set_dotted(d: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise SpecError(f"spec key '{dotted}': '{p}' is not a section")
        cur = nxt
    cur[parts[-1]] = value


def load_spec(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None, *,
              convert_models: bool = True) -> WorkloadSpec:
    """Read a YAML spec (optional), apply dotted-key overrides (from CLI flags), validate (paths: spec_paths).
    ``convert_models=False`` (``inferloom validate``): a ``.gguf`` model is checked, not converted (spec.model)."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise SpecError(f"spec file '{path}': not found; expected a YAML workload spec")
        try:
            loaded = load_yaml(p.read_bytes())
        except InputError as exc:
            raise SpecError(f"spec file '{path}': {exc}") from None
        except OSError as exc:
            raise SpecError(f"spec file '{path}': cannot be read ({exc.strerror}); check its permissions") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise SpecError(f"spec file '{path}': expected a mapping of keys at the top level")
        data = resolve_spec_paths(loaded, p.absolute().parent)
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, resolve_override(key, value, Path.cwd()))
    try:
        return WorkloadSpec.model_validate(data, context={"convert_models": convert_models})
    except ValidationError as err:
        raise SpecError(_one_line(err)) from None


def spec_hash(spec: WorkloadSpec) -> str:
    blob = json.dumps(spec.to_dict(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def objective_label(spec: "WorkloadSpec | Mapping[str, Any]") -> str:
    """What the protocol's per-run value is, for progress lines and reports:
    ``output tok/s``, ``goodput req/s``, or a custom workload's objective name
    (``1/<name>`` when lower is better: the protocol compares the inverse, so
    that higher is always faster)."""
    def get(obj: Any, key: str, default: Any = None) -> Any:
        return obj.get(key, default) if isinstance(obj, Mapping) else getattr(obj, key, default)

    if get(spec, "framework") == "diffusers":
        return "images/s"
    if get(spec, "framework") == "custom":
        c = get(spec, "custom") or {}
        name = str(get(c, "objective") or "objective")
        return name if get(c, "higher_is_better", True) else f"1/{name}"
    return "goodput req/s" if get(spec, "objective") == "goodput" else "output tok/s"
