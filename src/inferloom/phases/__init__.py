"""The session's phases: the coordinator's run loop, the runner that starts
and resumes a session directory, the :class:`~inferloom.phases.context.SessionContext`
every phase step receives, the coordinator's budget split (``budget``) and
wiring (``strategy``), one module (or group) per phase (prelude, enablement,
framework, kernel, sweep, close; ``custom*`` for a custom workload's source
patches), none importing another, and :mod:`~inferloom.phases.trial`, the one
proposal -> measurement -> verdict step they share. Storage (state, ledger,
manifest) is :mod:`inferloom.session`."""

__all__: list[str] = []
