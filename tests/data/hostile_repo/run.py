"""Entrypoint of the hostile-patch test workload: objective = kernel.SPEED, gate = gate.check."""
import json
import os

import gate
import inputs
import kernel

x = inputs.load()
y = kernel.compute(x)
res = {"objective": {"value": float(kernel.SPEED), "unit": "items/s"}, "quality_gate": gate.check(x, y)}
with open(os.environ["INFERLOOM_RESULT"], "w") as f:
    f.write(json.dumps(res))
