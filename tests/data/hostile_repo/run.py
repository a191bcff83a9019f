"""Entrypoint of the hostile-patch test workload: items/s over kernel.compute, paced by kernel.SPEED; gate = gate.check."""
import json
import os
import time

import gate
import inputs
import kernel

x = inputs.load()
t0 = time.perf_counter()
y = kernel.compute(x)
time.sleep(40.0 / kernel.SPEED)
timed = time.perf_counter() - t0
res = {"objective": {"value": len(x) / timed, "unit": "items/s"}, "timed_s": timed, "quality_gate": gate.check(x, y)}
with open(os.environ["INFERLOOM_RESULT"], "w") as f:
    f.write(json.dumps(res))
