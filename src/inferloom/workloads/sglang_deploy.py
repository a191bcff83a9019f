"""The final SGLang stack as a user deploys it (the ``sglang`` descriptor's ``deploy`` target): the server
command built by the very builder inferloom launched its own servers with
(:func:`inferloom.workloads.sglang_launch.launch_command`, with the installed server's flags the manifest
recorded), less ``--host``/``--port`` (the user's own) and less the memory share inferloom derived for two
servers side by side (said in a note); ``sglang serve`` (SGLang's recommended entry point, the same
parser) in a note. A :data:`~inferloom.workloads.deploy.Deploy`-shaped dict, as ``deploy.vllm_deploy``'s."""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.models.presets import PRESETS
from inferloom.workloads.deploy import _server_flags, _without_own, command_section, preset_server_dir, shell_command
from inferloom.workloads.sglang_launch import launch_command

__all__ = ["sglang_deploy"]


def sglang_deploy(spec: Any, final: Mapping[str, Any], manifest: Mapping[str, Any],
                  entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The server command of the final stack."""
    cfg = {**dict(final), **dict(spec.pinned)}
    model = preset_server_dir(spec) if spec.model in PRESETS else spec.model
    argv, _, origin = launch_command(spec, model, cfg, 0, _server_flags(manifest))
    argv = _without_own(argv)
    env = dict(spec.serving.env)  # what launch_command adds to the inherited environment (SGLANG_LOG_MS: logs only)
    exact = shell_command(env, argv)
    serve = shell_command(env, ["sglang", "serve", *argv[3:]])
    notes = [f"The same with SGLang's own command line (its recommended entry point, the same parser): `{serve}`."]
    return command_section(exact, notes, origin, spec, entries, cfg)
