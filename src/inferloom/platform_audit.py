"""Platform audit (read-only) and GPU energy of timed runs.

:func:`audit` reads, changing nothing:

* ``cpu``: the scaling governor of each CPU (counted by value), turbo/boost, SMT (control and active),
  NUMA nodes, memory (total, available), transparent huge pages; a file that isn't there is ``None``;
* ``cpu.energy_counters``: whether the CPU's RAPL energy counters (``/sys/class/powercap/intel-rapl:N``, the
  packages; AMD's are exposed there too) can be read, and why not (none exposed: a VM or a CPU without them;
  root-only ``energy_uj``);
* ``gpu``: per NVIDIA GPU through NVML (``nvidia-ml-py``, imported guarded): name, clocks (current, max,
  application: graphics, SM, memory, MHz), ECC mode, persistence mode, power limit and draw (W),
  temperature (C). Without NVML (no package, no driver, no GPU) ``{"available": False, "why": ...}``.

:func:`audit_changes` lists what differs between two audits in the settings that should not change during a
session (governor, boost, SMT, NUMA, total memory, THP, max and application clocks, ECC, persistence, power
limit), ignoring what moves by itself (current clocks, temperature, power draw, available memory).

:class:`EnergyMeter` measures the GPU energy of one call (a timed run): NVML's energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, Volta and later) read before and after, else the power draw
sampled every 20 ms in a thread and integrated. :meth:`EnergyMeter.open` returns None where NVML is absent.
:class:`RaplMeter` does the same for the CPU packages from the RAPL counters (read before and after, a
counter's wrap past ``max_energy_range_uj`` undone); :meth:`RaplMeter.open` returns None where they can't be
read (:func:`rapl_status` says why).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

try:  # optional: NVIDIA only
    import pynvml as _nv
except ImportError:  # pragma: no cover - depends on the machine
    _nv = None

__all__ = ["audit", "cpu_audit", "gpu_audit", "audit_changes", "EnergyMeter", "RaplMeter", "rapl_status",
           "STABLE_GPU_FIELDS"]

_SYS = Path("/sys/devices/system")
_POWERCAP = Path("/sys/class/powercap")
STABLE_GPU_FIELDS = ("name", "clocks_max_mhz", "clocks_application_mhz", "ecc_mode", "persistence_mode",
                     "power_limit_w")
_STABLE_CPU_FIELDS = ("governors", "boost", "smt_control", "smt_active", "numa_nodes", "mem_total_kb",
                      "transparent_hugepage")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_audit(root: Path = _SYS) -> dict[str, Any]:
    governors: dict[str, int] = {}
    for p in sorted(root.glob("cpu/cpu[0-9]*/cpufreq/scaling_governor")):
        g = _read(p)
        if g:
            governors[g] = governors.get(g, 0) + 1
    boost = _read(root / "cpu/cpufreq/boost")
    no_turbo = _read(root / "cpu/intel_pstate/no_turbo")
    mem: dict[str, int] = {}
    for line in (_read(Path("/proc/meminfo")) or "").splitlines():
        k, _, v = line.partition(":")
        if k in ("MemTotal", "MemAvailable") and v.split():
            mem[k] = int(v.split()[0])
    thp = _read(Path("/sys/kernel/mm/transparent_hugepage/enabled"))
    return {
        "governors": governors or None,
        "boost": boost if boost is not None else (None if no_turbo is None else ("0" if no_turbo == "1" else "1")),
        "smt_control": _read(root / "cpu/smt/control"), "smt_active": _read(root / "cpu/smt/active"),
        "numa_nodes": len(list(root.glob("node/node[0-9]*"))) or None,
        "mem_total_kb": mem.get("MemTotal"), "mem_available_kb": mem.get("MemAvailable"),
        "transparent_hugepage": thp, "energy_counters": rapl_status(),
    }


def _rapl_zones(root: Path) -> list[Path]:
    """The package zones (``intel-rapl:N``, not their subzones ``intel-rapl:N:M``)."""
    return sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1) if root.is_dir() else []


def rapl_status(root: Path = _POWERCAP) -> dict[str, Any]:
    """``{"available": True, "zones": [names]}`` when every package zone's ``energy_uj`` reads, else
    ``{"available": False, "why": ...}``."""
    zones = _rapl_zones(root)
    if not zones:
        return {"available": False, "why": f"no RAPL energy counters: {root} has no intel-rapl zones on this machine "
                                           "(a VM or container that doesn't expose them, or a CPU without them)"}
    for z in zones:
        try:
            int((z / "energy_uj").read_text())
        except (OSError, ValueError) as exc:
            why = "root only (since Linux 5.10)" if isinstance(exc, PermissionError) else str(exc)
            return {"available": False, "why": f"RAPL counter {z / 'energy_uj'} can't be read: {why}"}
    return {"available": True, "zones": [_read(z / "name") or z.name for z in zones]}


def _q(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: the field is just unknown
        return None


def _clocks(h: Any, getter: Any) -> dict[str, Any]:
    return {name: _q(getter, h, kind) for name, kind in
            (("graphics", _nv.NVML_CLOCK_GRAPHICS), ("sm", _nv.NVML_CLOCK_SM), ("memory", _nv.NVML_CLOCK_MEM))}


def _init() -> str | None:
    """None when NVML is usable; else why not."""
    if _nv is None:
        return "nvidia-ml-py (pynvml) is not installed"
    try:
        _nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver, no GPU: a CPU machine
        return f"NVML not available ({type(exc).__name__}: {exc}): no NVIDIA driver or GPU on this machine"
    return None


def gpu_audit() -> dict[str, Any]:
    why = _init()
    if why:
        return {"available": False, "why": why}
    try:
        gpus = []
        for i in range(_nv.nvmlDeviceGetCount()):
            h = _nv.nvmlDeviceGetHandleByIndex(i)
            name = _q(_nv.nvmlDeviceGetName, h)
            ecc = _q(_nv.nvmlDeviceGetEccMode, h)
            limit = _q(_nv.nvmlDeviceGetPowerManagementLimit, h)
            draw = _q(_nv.nvmlDeviceGetPowerUsage, h)
            gpus.append({
                "index": i, "name": name.decode() if isinstance(name, bytes) else name,
                "clocks_current_mhz": _clocks(h, _nv.nvmlDeviceGetClockInfo),
                "clocks_max_mhz": _clocks(h, _nv.nvmlDeviceGetMaxClockInfo),
                "clocks_application_mhz": _clocks(h, _nv.nvmlDeviceGetApplicationsClock),
                "ecc_mode": None if ecc is None else {"current": ecc[0], "pending": ecc[1]},
                "persistence_mode": _q(_nv.nvmlDeviceGetPersistenceMode, h),
                "power_limit_w": None if limit is None else limit / 1000.0,
                "power_draw_w": None if draw is None else draw / 1000.0,
                "temperature_c": _q(_nv.nvmlDeviceGetTemperature, h, _nv.NVML_TEMPERATURE_GPU),
            })
        return {"available": True, "driver": _q(_nv.nvmlSystemGetDriverVersion), "gpus": gpus}
    finally:
        _q(_nv.nvmlShutdown)


def audit() -> dict[str, Any]:
    """The read-only platform audit (see the module docstring), with the unix time it was taken."""
    return {"taken_at": time.time(), "cpu": cpu_audit(), "gpu": gpu_audit()}


def audit_changes(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """``[{"what", "before", "after"}]`` for each stable setting that differs (see the module docstring)."""
    out = []
    cb, ca = before.get("cpu") or {}, after.get("cpu") or {}
    for k in _STABLE_CPU_FIELDS:
        if cb.get(k) != ca.get(k):
            out.append({"what": f"cpu.{k}", "before": cb.get(k), "after": ca.get(k)})
    gb, ga = before.get("gpu") or {}, after.get("gpu") or {}
    if gb.get("available") != ga.get("available"):
        out.append({"what": "gpu.available", "before": gb.get("available"), "after": ga.get("available")})
    for b, a in zip(gb.get("gpus") or [], ga.get("gpus") or []):
        for k in STABLE_GPU_FIELDS:
            if b.get(k) != a.get(k):
                out.append({"what": f"gpu{b.get('index')}.{k}", "before": b.get(k), "after": a.get(k)})
    return out


class EnergyMeter:
    """GPU energy of one call on the GPUs NVML sees (see the module docstring)."""

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles
        self.counter = all(_q(_nv.nvmlDeviceGetTotalEnergyConsumption, h) is not None for h in handles)

    @classmethod
    def open(cls) -> "EnergyMeter | None":
        """A meter over every GPU NVML sees, or None (no NVML, no GPU)."""
        if _init():
            return None
        n = _q(_nv.nvmlDeviceGetCount) or 0
        return cls([_nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]) if n else None

    def _total_mj(self) -> float:
        return float(sum(_nv.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles))

    def _power_w(self) -> float:
        return sum(_nv.nvmlDeviceGetPowerUsage(h) for h in self.handles) / 1000.0

    def measure(self, fn: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
        """``(fn(), {"gpu_energy_j", "gpu_power_w_mean", "energy_method"})``."""
        if self.counter:
            e0, t0 = self._total_mj(), time.perf_counter()
            res = fn()
            e1, t1 = self._total_mj(), time.perf_counter()
            joules = (e1 - e0) / 1000.0
            return res, {"gpu_energy_j": joules, "gpu_power_w_mean": joules / max(t1 - t0, 1e-9),
                         "energy_method": "nvml_energy_counter"}
        samples: list[tuple[float, float]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append((time.perf_counter(), self._power_w()))
                stop.wait(0.02)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        try:
            res = fn()
        finally:
            stop.set()
            th.join()
        joules = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(samples, samples[1:]))
        span = samples[-1][0] - samples[0][0] if len(samples) > 1 else 0.0
        return res, {"gpu_energy_j": joules, "gpu_power_w_mean": joules / span if span else None,
                     "energy_method": f"nvml_power_sampled_20ms ({len(samples)} samples)"}


class RaplMeter:
    """CPU package energy of one call from the RAPL counters (see the module docstring)."""

    def __init__(self, zones: list[Path]) -> None:
        self.zones = zones
        self.ranges = [int(_read(z / "max_energy_range_uj") or 0) for z in zones]

    @classmethod
    def open(cls, root: Path = _POWERCAP) -> "RaplMeter | None":
        return cls(_rapl_zones(root)) if rapl_status(root)["available"] else None

    def _read(self) -> list[int]:
        return [int((z / "energy_uj").read_text()) for z in self.zones]

    def measure(self, fn: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
        """``(fn(), {"cpu_energy_j", "cpu_power_w_mean", "cpu_energy_method"})``."""
        e0, t0 = self._read(), time.perf_counter()
        res = fn()
        e1, t1 = self._read(), time.perf_counter()
        uj = sum((b - a) if b >= a else (b - a + r) for a, b, r in zip(e0, e1, self.ranges))
        joules = uj / 1e6
        return res, {"cpu_energy_j": joules, "cpu_power_w_mean": joules / max(t1 - t0, 1e-9),
                     "cpu_energy_method": f"rapl ({len(self.zones)} package zone(s))"}
