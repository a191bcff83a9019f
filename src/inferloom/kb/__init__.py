"""The Recipe knowledge base: what earlier sessions learned, per workload.

One recipe per seven-field :class:`WorkloadKey` (model, hardware, framework,
model type, architecture, framework version, precision) holding the winning
configuration with its measured ratio and interval, the sessions that
produced it, what worked, what failed (with rules) and lessons. Stored
through SQLAlchemy Core at a SQL URL: a SQLite file by default
(:func:`default_kb_url`: ``$INFERLOOM_KB`` or ``~/.cache/inferloom/kb.sqlite``),
a PostgreSQL server for a fleet.

* :meth:`RecipeStore.record_session`, :meth:`RecipeStore.record_closed_session`: strict writes
  (see :mod:`inferloom.kb.recipe`).
* :meth:`RecipeStore.lookup`: relaxed lookup (tiers and confidences in :mod:`inferloom.kb.lookup`).
* :meth:`RecipeStore.mark_drift`, :meth:`RecipeStore.put_ceiling` / :meth:`RecipeStore.get_ceiling`.
* :meth:`RecipeStore.export_document` / :meth:`RecipeStore.import_json` (:mod:`inferloom.kb.merge`),
  :meth:`RecipeStore.list_recipes`, :meth:`RecipeStore.show`.
"""

from inferloom.kb.db import SCHEMA_VERSION, KBError, default_kb_url
from inferloom.kb.key import KEY_FIELDS, WorkloadKey
from inferloom.kb.lookup import DRIFT_FACTOR, NEVER_RELAXED, TIERS, LookupResult, TierResult, format_lookup
from inferloom.kb.merge import ImportResult
from inferloom.kb.recipe import Recipe
from inferloom.kb.rows import Ceiling
from inferloom.kb.store import RecipeStore, RecordResult

__all__ = [
    "SCHEMA_VERSION", "KBError", "default_kb_url", "KEY_FIELDS", "WorkloadKey", "TIERS", "DRIFT_FACTOR",
    "NEVER_RELAXED", "LookupResult", "TierResult", "format_lookup", "Recipe", "RecipeStore", "RecordResult",
    "ImportResult", "Ceiling",
]
