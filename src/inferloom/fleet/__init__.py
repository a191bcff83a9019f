"""``inferloom fleet``: many sessions over many machines on Ray, one shared knowledge base.

* :mod:`~inferloom.fleet.plan`: a fleet file -> the planned sessions and their order (warm-start groups).
* :mod:`~inferloom.fleet.worker`: one session as a Ray task runs it (start or resume; failures are data).
* :mod:`~inferloom.fleet.status`: where each session stands, read from its directory.
* :mod:`~inferloom.fleet.driver`: Ray (embedded or a cluster), scheduling, retries, live progress.
* :mod:`~inferloom.fleet.report`: the fleet report (HTML, the session report's style) and summary JSON.

See docs/fleet.md. Ray is an optional dependency (the ``fleet`` extra); only
:mod:`~inferloom.fleet.driver` imports it.
"""

from inferloom.fleet.plan import FleetError, FleetPlan, PlannedSession, load_fleet
from inferloom.fleet.status import SessionStatus, fleet_status

__all__ = ["FleetError", "FleetPlan", "PlannedSession", "load_fleet", "SessionStatus", "fleet_status"]
