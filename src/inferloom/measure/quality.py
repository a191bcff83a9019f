"""The quality contract for text generation.

Reference = the stock configuration's own outputs on a fixed prompt set.
Three checks, each with a declared threshold (defaults and their justification
in ``docs/quality.md``):

* ``top1_agreement``: teacher-forced on the stock greedy continuations, the
  fraction of positions where the candidate's most likely next token equals
  stock's. Must be >= ``min_top1_agreement``.
* ``mean_kl``: mean over those positions of KL(stock || candidate) in nats.
  Must be <= ``max_mean_kl``.
* ``greedy_agreement``: the candidate's own greedy continuation through its
  real generation path (cache, compile, batching, speculation); per prompt the
  fraction of the continuation matched before the first differing token,
  averaged. Must be >= ``min_greedy_agreement``.

The verdict names the first failed check and the measured value. The check
functions are pure; :func:`capture_reference` and :func:`evaluate` call the
adapter's probes. An image generator (the ``ImageOutputs`` hook) is judged by
:mod:`inferloom.measure.image_quality` instead (PSNR, SSIM, latent
divergence), through the same three entry points.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Sequence

from inferloom.measure import image_quality as IQ
from inferloom.spec import check_bounds, field_default, QualitySpec, WorkloadSpec
from inferloom.workloads import prompts as P
from inferloom.workloads.base import ApproximateScores, GreedyLogprobs, ImageOutputs

__all__ = [
    "QualityThresholds",
    "Reference",
    "QualityVerdict",
    "quality_prompt_sets",
    "teacher_forced_agreement",
    "greedy_agreement",
    "judge",
    "self_consistency",
    "path_gap_noise",
    "effective_tie_margin",
    "capture_reference",
    "evaluate",
]

# Quality prompt seeds are far from the timed runs' seeds (see bench.run_seed_base).
EVAL_SEED_OFFSET = 7_000_001
HELDOUT_SEED_OFFSET = 9_000_011


def _spec(name: str) -> Any:
    return field_default(QualitySpec, name)


@dataclass(frozen=True)
class QualityThresholds:
    """The contract's thresholds: the spec's ``quality`` section, built with
    :meth:`from_spec`. :class:`~inferloom.spec.QualitySpec` declares every
    default and bound once; direct construction takes the same defaults and is
    checked against the same bounds."""

    min_top1_agreement: float = _spec("min_top1_agreement")
    max_mean_kl: float = _spec("max_mean_kl")
    min_greedy_agreement: float = _spec("min_greedy_agreement")
    tie_margin: float = _spec("tie_margin")
    min_psnr_db: float = _spec("min_psnr_db")
    min_ssim: float = _spec("min_ssim")
    max_latent_rel_err: float = _spec("max_latent_rel_err")

    def __post_init__(self) -> None:
        check_bounds(QualitySpec, asdict(self), "quality")

    @classmethod
    def from_spec(cls, q: QualitySpec) -> "QualityThresholds":
        return cls(**{f.name: getattr(q, f.name) for f in fields(cls)})


@dataclass
class Reference:
    set_name: str
    prompts: list[list[int]]
    continuations: list[list[int]]
    logprobs: Any  # torch.Tensor [n, T, V], float32, CPU
    path_noise_nats: float | None = None  # stock's own decode-vs-forward gap noise


def path_gap_noise(incremental: Any, forward: Any) -> float:
    """Pure: the largest change, over all positions, of the log-prob gap between
    the two most likely tokens when the *same* configuration computes the same
    sequence two ways (incremental decoding with a cache vs one full forward).
    That change is rounding noise by construction: a flip between two tokens
    closer than this is a tie-break, not an error."""
    import torch

    inc = incremental.to(torch.float64)
    fwd = forward.to(torch.float64)
    if inc.shape != fwd.shape:
        raise ValueError(f"path noise: shapes differ {tuple(inc.shape)} vs {tuple(fwd.shape)}")
    top2 = fwd.topk(2, dim=-1).indices
    gap_f = fwd.gather(-1, top2[..., :1]) - fwd.gather(-1, top2[..., 1:])
    gap_i = inc.gather(-1, top2[..., :1]) - inc.gather(-1, top2[..., 1:])
    d = (gap_f - gap_i).abs()
    return float(d.max().item()) if torch.isfinite(d).all() else float("inf")


# A candidate's rounding differs from stock's by up to the sum of two paths'
# noise; the calibrated margin is this multiple of stock's own path noise.
PATH_NOISE_FACTOR = 2.0


@dataclass
class QualityVerdict:
    set_name: str
    passed: bool
    failed_check: str | None
    message: str
    values: dict[str, float]
    thresholds: dict[str, float]
    n_prompts: int
    positions: int
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def quality_prompt_sets(spec: WorkloadSpec, adapter: Any) -> dict[str, list[list[int]]]:
    """The fixed eval set and the separate held-out set, as token-id prompts.

    Seeds derive from the spec's seed with fixed offsets, so every run of the
    same spec sees the same sets, and never a timed run's prompts. Prompts come
    from the adapter (random ids, or its texts), or from ``quality.prompts_file``.
    """
    q = spec.quality
    if isinstance(adapter, ImageOutputs):  # items [prompt_index, noise_seed]
        return IQ.image_sets(adapter, spec.seed, {"eval": (q.eval_prompts, EVAL_SEED_OFFSET),
                                                  "heldout": (q.heldout_prompts, HELDOUT_SEED_OFFSET)})
    out: dict[str, list[list[int]]] = {}
    texts, tok = None, None
    if q.prompts_file:
        texts = P.load_prompt_file(q.prompts_file, q.chat_template, "quality.chat_template")
        if len(texts) < 2:
            raise P.PromptError(f"quality.prompts_file '{q.prompts_file}': needs at least 2 texts (half eval, half "
                                "held out)")
        tok = getattr(adapter, "tokenizer", None)  # a server's: its model directory's own (vllm_texts)
        if tok is None:
            raise P.PromptError(f"quality.prompts_file '{q.prompts_file}': the {getattr(adapter, 'name', 'workload')} "
                                "adapter has no tokenizer to encode texts with; leave quality.prompts_file out")
    for name, n, offset in (
        ("eval", q.eval_prompts, EVAL_SEED_OFFSET),
        ("heldout", q.heldout_prompts, HELDOUT_SEED_OFFSET),
    ):
        seed = spec.seed + offset
        if texts is not None:
            half = len(texts) // 2
            pool = texts[:half] if name == "eval" else texts[half:]
            if q.chat_template:  # each chat rendered whole, its last prompt_len tokens probed (prompts module)
                ids = P.render_chats(pool, tok, f"quality.prompts_file '{q.prompts_file}'",
                                     range(1 + (0 if name == "eval" else half), 1 + len(texts)),
                                     chat_flag="quality.chat_template")
                out[name] = P.window_prompts(ids, q.prompt_len, seed, n, keep="tail")
            else:
                out[name] = P.text_prompts(pool, tok, q.prompt_len, seed, n)
        else:
            out[name] = adapter.prompts(seed, n, q.prompt_len)
    return out


def teacher_forced_agreement(ref_logprobs: Any, cand_logprobs: Any, tie_margin: float = 0.0) -> dict[str, float]:
    """Pure: top-1 agreement and KL(ref || cand) over [n, T, V] log-prob tensors.

    ``top1_agreement`` counts a position as agreeing when the candidate's top
    token is stock's top token *or a near-tie of it*: its stock log-prob is
    within ``tie_margin`` nats of stock's best. Rounding-level changes flip
    exact ties and near-ties; a broken computation picks tokens stock
    considered clearly worse. ``top1_exact`` is the strict rate.
    """
    import torch

    ref = ref_logprobs.to(torch.float64)
    cand = cand_logprobs.to(torch.float64)
    if ref.shape != cand.shape:
        raise ValueError(f"log-prob shapes differ: reference {tuple(ref.shape)}, candidate {tuple(cand.shape)}")
    if not torch.isfinite(cand).all():
        # NaN or +inf never passes: report it as total disagreement.
        return {"top1_agreement": 0.0, "top1_exact": 0.0, "mean_kl": float("inf"), "max_kl": float("inf")}
    cand_top = cand.argmax(-1)
    exact = (ref.argmax(-1) == cand_top).double().mean().item()
    gap = ref.max(-1).values - ref.gather(-1, cand_top.unsqueeze(-1)).squeeze(-1)
    top1 = (gap <= tie_margin).double().mean().item()
    # exp(ref) * (ref - cand), with 0 * (-inf) := 0 where ref has no mass.
    p = ref.exp()
    diff = torch.where(p > 0, ref - cand, torch.zeros_like(ref))
    kl = (p * diff).sum(-1)
    return {"top1_agreement": top1, "top1_exact": exact, "mean_kl": kl.mean().item(), "max_kl": kl.max().item()}


def greedy_agreement(
    ref: Sequence[Sequence[int]],
    cand: Sequence[Sequence[int]],
    ref_logprobs: Any = None,
    tie_margin: float = 0.0,
) -> dict[str, float]:
    """Pure: per prompt, the fraction of the continuation matched before the
    first difference, averaged (``greedy_prefix``).

    ``greedy_agreement`` is the same, except that a divergence at a stock
    near-tie (the candidate's token within ``tie_margin`` nats of stock's best
    at that position, read from ``ref_logprobs`` [n, T, V], which at the first
    difference conditions on exactly the shared prefix) counts as agreement:
    after a legitimate tie-break the two texts may differ entirely.
    """
    if len(ref) != len(cand):
        raise ValueError(f"{len(ref)} reference continuations but {len(cand)} candidate ones")
    fracs, tie_fracs, exact, tie_breaks = [], [], 0, 0
    for i, (r, c) in enumerate(zip(ref, cand)):
        n = 0
        for a, b in zip(r, c):
            if a != b:
                break
            n += 1
        if len(c) != len(r):
            n = min(n, len(c))
        frac = n / len(r) if r else 1.0
        fracs.append(frac)
        same = list(r) == list(c)
        exact += int(same)
        tie = False
        if not same and ref_logprobs is not None and n < len(r) and n < len(c):
            row = ref_logprobs[i, n]
            tie = float(row.max() - row[int(c[n])]) <= tie_margin
        tie_breaks += int(tie)
        tie_fracs.append(1.0 if tie else frac)
    k = len(ref)
    return {
        "greedy_agreement": sum(tie_fracs) / k if k else 1.0,
        "greedy_prefix": sum(fracs) / k if k else 1.0,
        "exact_match_rate": exact / k if k else 1.0,
        "tie_break_divergences": float(tie_breaks),
    }


def judge(set_name: str, values: dict[str, float], th: QualityThresholds, n: int, positions: int) -> QualityVerdict:
    """Pure: apply the thresholds; the verdict names the first failed check."""
    checks = (
        ("top1_agreement", values["top1_agreement"] >= th.min_top1_agreement, ">=", th.min_top1_agreement),
        ("mean_kl", values["mean_kl"] <= th.max_mean_kl, "<=", th.max_mean_kl),
        ("greedy_agreement", values["greedy_agreement"] >= th.min_greedy_agreement, ">=", th.min_greedy_agreement),
    )
    return _verdict(set_name, checks, values, th, n, positions)


def _verdict(set_name: str, checks: Sequence[tuple[str, bool, str, float]], values: dict[str, float],
             th: QualityThresholds, n: int, positions: int) -> QualityVerdict:
    for name, ok, op, limit in checks:
        if not ok:
            return QualityVerdict(
                set_name, False, name,
                f"{set_name}: {name} = {values[name]:.4g}, required {op} {limit:g}",
                values, asdict(th), n, positions,
            )
    return QualityVerdict(set_name, True, None, f"{set_name}: all checks passed", values, asdict(th), n, positions)


def self_consistency(ref: Reference) -> dict[str, float]:
    """Pure: how often stock's own greedy path (incremental decoding) picked a
    token other than the argmax of stock's own teacher-forced forward: the
    rounding noise between two computations of the *same* configuration, a
    yardstick for the candidate's disagreements."""
    lp = ref.logprobs
    import torch

    chosen = torch.tensor(ref.continuations, dtype=torch.long)
    flips = lp.argmax(-1) != chosen
    gap = lp.max(-1).values - lp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
    return {
        "stock_path_flip_rate": flips.double().mean().item(),
        "stock_path_max_gap_nats": gap.max().item(),
    }


def capture_reference(adapter: Any, handle: Any, set_name: str, prompts: list[list[int]], continuation_len: int) -> Reference:
    """Stock's greedy continuations and its teacher-forced log-probs on them.

    When the adapter offers the optional ``greedy_logprobs`` probe, stock's
    decode-path log-probs are compared with its forward-path ones to measure
    the rounding noise of this model, dtype and device (``path_noise_nats``)."""
    if isinstance(adapter, ImageOutputs):
        return IQ.capture_image_reference(adapter, handle, set_name, prompts)  # type: ignore[return-value]
    noise = None
    if isinstance(adapter, GreedyLogprobs):
        conts, inc_lp = adapter.greedy_logprobs(handle, prompts, continuation_len)
        lp = adapter.score(handle, prompts, conts)
        noise = path_gap_noise(inc_lp, lp)
    else:
        conts = adapter.greedy(handle, prompts, continuation_len)
        lp = adapter.score(handle, prompts, conts)
    return Reference(set_name, prompts, conts, lp, noise)


def effective_tie_margin(ref: Reference, th: QualityThresholds) -> float:
    """The declared tie margin, widened to PATH_NOISE_FACTOR x stock's own path
    noise when that was measured (it never narrows the declared margin)."""
    if ref.path_noise_nats is None or ref.path_noise_nats != ref.path_noise_nats:
        return th.tie_margin
    return max(th.tie_margin, PATH_NOISE_FACTOR * ref.path_noise_nats)


def evaluate(adapter: Any, handle: Any, ref: Reference, th: QualityThresholds) -> QualityVerdict:
    """Run the candidate's probes against a stock reference and judge them."""
    if isinstance(ref, IQ.ImageReference):
        values, details = IQ.compare_images(ref, adapter.generate_images(handle, ref.prompts))
        n = len(ref.prompts)
        v = _verdict(ref.set_name, IQ.image_checks(values, th), values, th, n, int(n * ref.trajectory.shape[1]))
        v.details.update(details)
        return v
    cand_conts = adapter.greedy(handle, ref.prompts, len(ref.continuations[0]))
    cand_lp = adapter.score(handle, ref.prompts, ref.continuations)
    margin = effective_tie_margin(ref, th)
    values = {
        **teacher_forced_agreement(ref.logprobs, cand_lp, margin),
        **greedy_agreement(ref.continuations, cand_conts, ref.logprobs, margin),
    }
    positions = int(ref.logprobs.shape[0] * ref.logprobs.shape[1])
    verdict = judge(ref.set_name, values, th, len(ref.prompts), positions)
    verdict.details["reference"] = {
        **self_consistency(ref),
        "stock_path_noise_nats": ref.path_noise_nats,
        "tie_margin_declared": th.tie_margin,
        "tie_margin_used": margin,
    }
    approx = adapter.score_approximation if isinstance(adapter, ApproximateScores) else None
    if isinstance(approx, str):  # e.g. a server's top-k log-probabilities: stated in every verdict
        verdict.details["score_approximation"] = approx
    return verdict
