"""The workload spec: YAML in, a validated :class:`WorkloadSpec` out.

``workload.py`` holds the top-level spec and its loader; the sections live
beside it (``serving.py``, ``quality.py``, ``llm.py``, ``diffusion.py``,
``custom.py``; ``paths.py`` resolves file paths, ``fields.py`` holds the shared
field helpers). Import from here: ``from inferloom.spec import load_spec``.
"""

from inferloom.spec.workload import *  # noqa: F401,F403
from inferloom.spec.workload import __all__  # noqa: F401
