"""wait_quiet: the quiet wait before each timed run of a server pair. A neighbour that never idles below a floor
(SGLang's scheduler polls on one core: the first H200 session, 2026-12-05, waited the full 10 s before every run:
2 of every 3 seconds of its A/A) costs the limit once; then the wait is measured above that floor."""

from pytest import approx

from inferloom.workloads.server_process import wait_quiet


class _Server:
    def __init__(self):
        self.idle_cpu_floor = 0.0

    def alive(self):
        return True


def _reader(fracs, window_s):
    """A CPU-seconds counter whose successive windows show ``fracs`` cores (the last repeated)."""
    state = {"t": 0.0, "i": 0, "half": False}

    def read(_servers):
        if state["half"]:  # the second read of a window: advance by that window's use
            f = fracs[min(state["i"], len(fracs) - 1)]
            state["t"] += f * window_s
            state["i"] += 1
        state["half"] = not state["half"]
        return state["t"]
    return read


def test_a_neighbour_that_spins_on_one_core_costs_the_limit_once_then_not():
    s = _Server()
    w = 0.01
    r1 = wait_quiet([s], window_s=w, limit_s=0.3, cpu_seconds=_reader([1.3, 1.1, 1.02, 1.05, 1.01], w))
    assert r1["waited_s"] >= 0.3 and abs(s.idle_cpu_floor - 1.01) < 1e-9  # the least it used: its idle floor
    r2 = wait_quiet([s], window_s=w, limit_s=0.3, cpu_seconds=_reader([1.6, 1.12], w))
    assert r2["waited_s"] < 0.1 and r2["others_cpu_frac"] == approx(1.12) and r2["idle_floor_cpu_frac"] == approx(1.01)


def test_a_neighbour_that_winds_down_is_waited_for_and_learns_no_floor():
    s = _Server()
    w = 0.01
    r = wait_quiet([s], window_s=w, limit_s=1.0, cpu_seconds=_reader([3.0, 2.0, 0.5, 0.02], w))
    assert r["others_cpu_frac"] == approx(0.02) and s.idle_cpu_floor == 0.0 and "idle_floor_cpu_frac" not in r
    # busy above the floor (a neighbour still serving) is still waited for
    s.idle_cpu_floor = 1.0
    r = wait_quiet([s], window_s=w, limit_s=1.0, cpu_seconds=_reader([3.0, 1.5, 1.05], w))
    assert r["others_cpu_frac"] == approx(1.05)


def test_no_live_neighbour_is_no_wait():
    class Dead(_Server):
        def alive(self):
            return False
    assert wait_quiet([Dead()]) == {"waited_s": 0.0, "others_cpu_frac": None}


def test_a_neighbour_still_winding_down_at_the_limit_learns_no_floor():
    """Use falling through the whole wait (3 cores to 1.2) is a neighbour still busy, not an idle floor."""
    s = _Server()
    w = 0.01
    fr = [3.0 - i * 0.06 for i in range(40)]
    r = wait_quiet([s], window_s=w, limit_s=0.3, cpu_seconds=_reader(fr, w))
    assert r["waited_s"] >= 0.3 and s.idle_cpu_floor == 0.0


def test_a_steady_floor_is_learned_after_learn_after_s_not_at_the_limit():
    """SGLang's 10 s at each new server's first wait (the 2026-12-05 run 2: each trial's first run): a use steady
    over the wait's second half once ``learn_after_s`` has passed is the floor, and the wait ends there."""
    s = _Server()
    w = 0.01
    r = wait_quiet([s], window_s=w, limit_s=5.0, learn_after_s=0.1,
                   cpu_seconds=_reader([1.4, 1.1, 1.03, 1.06, 1.02, 1.04], w))
    assert r["waited_s"] < 1.0 and s.idle_cpu_floor == approx(1.04) and r["idle_floor_cpu_frac"] == approx(1.04)
    # a neighbour winding down for longer than learn_after_s (falling 0.06 a window) is not a floor: waited for
    s2 = _Server()
    fr = [3.0 - i * 0.06 for i in range(49)] + [0.02]
    r = wait_quiet([s2], window_s=w, limit_s=5.0, learn_after_s=0.1, cpu_seconds=_reader(fr, w))
    assert r["others_cpu_frac"] == approx(0.02) and s2.idle_cpu_floor == 0.0
