"""The safe change pipeline for source patches (custom workloads, issue 6):
``source`` (where candidates come from) -> ``parse`` (gate a) -> ``policy``
(gate b) -> ``effect`` (gate b2: what git itself changed) -> ``critic`` (gate c) -> ``worktree`` + the coordinator's measured
trial (gate d) -> a commit on the session branch, or nothing at all.
``session`` wires it into the coordinator; ``export`` writes the review
bundle; ``report`` renders it from the ledger."""
