"""The sandbox (inferloom.sandbox, docs/security.md), with the real bubblewrap:
a patched entrypoint and a Specialist command that try to write outside their
tree and to open a network socket fail inside it, and the outside sees
nothing; a sandboxed process dies with inferloom; the opt-out is recorded in
the manifest and the report; without bubblewrap a patch session refuses to
start (exit 2).

bubblewrap is required here: `make test` installs it (Debian package
``bubblewrap``) when it is missing and it runs as root. These tests fail,
saying so, rather than skip when it can't run."""

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml

from custom_helpers import ROOT, checksums, git, git_repo, load_make_demo, tiny_custom_spec
from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.patches.source import CommandPatchSource, PatchSourceError
from inferloom.phases.runner import start
from inferloom.sandbox import ENV_BINARY, SandboxUnavailable, bwrap_binary, probe, resolve
from inferloom.session import ledger as L
from inferloom.session.state import Phase
from inferloom.spec import load_spec
from inferloom.workloads.custom import CustomAdapter

PATCHES = ROOT / "examples" / "custom" / "patches"
SRC = str(ROOT / "src")

# What a hostile patch (or Specialist) runs: each attempt to reach outside, its outcome on stderr.
ESCAPES = textwrap.dedent('''
    def _escape():
        """Try to reach outside the tree: write (append) to each path of
        ESCAPE_PATHS, then connect to 127.0.0.1:ESCAPE_PORT. Returns what worked."""
        import sys
        worked, out = [], []
        for path in os.environ["ESCAPE_PATHS"].split(":"):
            try:
                with open(path, "a") as f:
                    f.write("escaped\\n")
                worked.append(path)
                out.append("WROTE " + path)
            except OSError as exc:
                out.append("blocked " + path + ": " + str(exc.strerror))
        try:
            s = __import__("so" + "cket").create_connection(("127.0.0.1", int(os.environ["ESCAPE_PORT"])), timeout=2)
            s.sendall(b"escaped")
            worked.append("connect")
            out.append("CONNECTED")
        except OSError as exc:
            out.append("blocked connect: " + str(exc.strerror))
        sys.stderr.write("\\n".join(out) + "\\n")
        return worked
''')


@pytest.fixture(autouse=True)
def _bubblewrap_runs():
    binary = bwrap_binary()
    why = probe(binary)[0] if binary else "bwrap is not on PATH"
    assert why is None, (f"bubblewrap can't run here ({why}): these tests need it; `make test` installs it as root "
                         "(apt-get install bubblewrap)")


@pytest.fixture
def outside():
    """A directory under $HOME, as a user's checkout and session directory are (not under /tmp, which the
    sandbox replaces with its own: there every outside path is simply absent)."""
    d = Path(tempfile.mkdtemp(prefix=".inferloom-sandbox-test-", dir=Path.home()))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def listener():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    yield srv
    srv.close()


def _nothing_connected(srv):
    return select.select([srv], [], [], 0.2)[0] == []


def _agents():
    return {"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic, "robustness": RuleRobustness()}


# -- the entrypoint, one escape at a time --------------------------------------------------------------------------

HOSTILE_RUN = "import json, os, socket\n" + ESCAPES + textwrap.dedent('''
    what, target = os.environ["ESCAPE"], os.environ.get("TARGET", "")
    if what == "write":
        with open(target, "a") as f:
            f.write("escaped\\n")
    elif what == "connect":
        socket.create_connection(("127.0.0.1", int(target)), timeout=2).sendall(b"escaped")
    with open("written-in-its-tree.txt", "w") as f:
        f.write("fine")
    with open(os.environ["INFERLOOM_RESULT"], "w") as f:
        json.dump({"objective": {"value": 1.0, "unit": "x"}, "quality_gate": {"passed": True}}, f)
''')


@pytest.fixture
def hostile(outside):
    repo = git_repo(outside / "repo", {"run.py": HOSTILE_RUN})
    spec = tiny_custom_spec(outside, knobs=[])
    adapter = CustomAdapter(spec)
    assert adapter.sandbox is not None and adapter.describe()["sandbox"]["mode"] == "bwrap"
    yield adapter, repo
    adapter.close()


def test_its_own_tree_and_private_tmp_are_writable(hostile, tmp_path, monkeypatch):
    adapter, _repo = hostile
    outside = Path("/tmp") / f"inferloom-escape-{uuid.uuid4().hex}"
    monkeypatch.setenv("ESCAPE", "write")
    monkeypatch.setenv("TARGET", str(outside))  # its private /tmp: the write works there, and stays there
    h = adapter.prepare({})
    rec = adapter.run(h, 1)
    assert rec.success, rec.error
    assert (h.tree / "written-in-its-tree.txt").read_text() == "fine"
    assert not outside.exists()


@pytest.mark.parametrize("where", ["checkout", "home", "tmp_outside", "another_tree", "session_dir"])
def test_a_patched_entrypoint_cannot_write_outside_its_tree(hostile, outside, tmp_path, monkeypatch, where):
    adapter, repo = hostile
    (outside / "another-tree").mkdir()
    (outside / "session").mkdir()
    (outside / "session" / "ledger.jsonl").write_text("{}\n")
    target = {"checkout": repo / "run.py", "home": Path.home() / f"inferloom-escape-{uuid.uuid4().hex}",
              "tmp_outside": tmp_path / "outside.txt", "another_tree": outside / "another-tree" / "x.py",
              "session_dir": outside / "session" / "ledger.jsonl"}[where]
    before = target.read_bytes() if target.exists() else None
    monkeypatch.setenv("ESCAPE", "write")
    monkeypatch.setenv("TARGET", str(target))
    try:
        rec = adapter.run(adapter.prepare({}), 1)
        after = target.read_bytes() if target.exists() else None
    finally:
        if before is None:
            target.unlink(missing_ok=True)
    assert not rec.success and rec.extra["kind"] == "exit"
    # under /tmp the path is not even there (a private /tmp); elsewhere the root is read-only
    assert ("No such file or directory" if where == "tmp_outside" else "Read-only file system") in rec.error, rec.error
    assert after == before


def test_a_patched_entrypoint_cannot_open_a_network_socket(hostile, listener, monkeypatch):
    adapter, _repo = hostile
    monkeypatch.setenv("ESCAPE", "connect")
    monkeypatch.setenv("TARGET", str(listener.getsockname()[1]))
    rec = adapter.run(adapter.prepare({}), 1)
    assert not rec.success and ("Connection refused" in rec.error or "unreachable" in rec.error), rec.error
    assert _nothing_connected(listener)


def _in_sandbox(script, cwd):
    sandbox, _rec = resolve("bwrap", patches=True)
    return subprocess.run(sandbox.wrap(["sh", "-c", script], cwd=cwd, writable=[cwd]), capture_output=True,
                          text=True, timeout=60)


def test_root_outside_is_powerless_inside(outside):
    # as root, bubblewrap keeps every capability unless told otherwise: then a remount makes / writable again
    target = outside / "user-file.txt"
    target.write_text("mine")
    work = outside / "work"  # its tree: the one writable place
    work.mkdir()
    res = _in_sandbox(f"mount -o remount,bind,rw / ; echo escaped > {target}; "
                      "echo 60 > /proc/sys/vm/swappiness; grep CapEff /proc/self/status", cwd=str(work))
    assert target.read_text() == "mine"
    assert "CapEff:\t0000000000000000" in res.stdout, res.stdout
    assert "Read-only file system" in res.stderr and "swappiness" in res.stderr, res.stderr


def test_credentials_under_home_and_host_sockets_are_hidden(outside, monkeypatch):
    home = outside / "home"
    monkeypatch.setenv("HOME", str(home))
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    (home / ".netrc").write_text("machine example.com password hunter2")
    (home / "project").mkdir()
    res = _in_sandbox("ls -A $HOME/.ssh; cat $HOME/.netrc; ls -A /run; echo done", cwd=str(home / "project"))
    assert res.returncode == 0 and res.stdout.strip() == "done", (res.stdout, res.stderr)


# -- the Specialist command -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("attempt", ["write_checkout", "write_home", "connect"])
def test_a_specialist_command_cannot_write_outside_or_connect(outside, listener, attempt):
    sandbox, _rec = resolve("bwrap", patches=True)
    home = Path.home() / f"inferloom-escape-{uuid.uuid4().hex}"
    checkout = git_repo(outside / "checkout", {"kernel.py": "x = 1\n"})
    code = {"write_checkout": f"open({str(checkout / 'kernel.py')!r}, 'a').write('escaped')",
            "write_home": f"open({str(home)!r}, 'w').write('escaped')",
            "connect": f"__import__('socket').create_connection(('127.0.0.1', {listener.getsockname()[1]}), 2)"}[attempt]
    script = f"import sys, os; sys.stdin.read(); open('notes.txt', 'w').write('its own dir'); {code}; print('--- a/x')"
    src = CommandPatchSource([sys.executable, "-c", script], timeout_s=30, sandbox=sandbox)
    try:
        with pytest.raises(PatchSourceError, match="Read-only file system|Connection refused|unreachable"):
            src.next_patch({"patches_seen": []})
        assert not home.exists()
    finally:
        home.unlink(missing_ok=True)
    assert (checkout / "kernel.py").read_text() == "x = 1\n" and _nothing_connected(listener)
    # the same command, unsandboxed, does reach out (the test is not vacuous); not for $HOME and the network
    if attempt == "write_checkout":
        CommandPatchSource([sys.executable, "-c", script], timeout_s=30).next_patch({"patches_seen": []})
        assert (checkout / "kernel.py").read_text() == "x = 1\nescaped"


def test_a_missing_specialist_program_could_not_start(tmp_path):
    sandbox, _rec = resolve("bwrap", patches=True)
    with pytest.raises(PatchSourceError, match="could not start: bwrap: execvp"):
        CommandPatchSource([str(tmp_path / "no-such-program")], sandbox=sandbox).next_patch({})


# -- a real session: a hostile patch and a hostile Specialist ----------------------------------------------------------

SPECIALIST = "import json, os, sys\n" + ESCAPES + textwrap.dedent('''
    state = json.load(sys.stdin)
    worked = [w for w in _escape() if not w.startswith("/tmp/")]  # /tmp is its own, private
    if worked:
        sys.exit("escaped: " + ", ".join(worked))
    open("scratch.txt", "w").write("its own directory is writable")
    if not state["patches_seen"] or state["patches_seen"] == ["09-hostile"]:
        sys.stdout.write(open(sys.argv[1]).read())
''')


def _hostile_patch(tmp_path, repo):
    """A diff to kernel.py (inside the allowlist, past the forbidden-pattern tripwire) that runs _escape() on import."""
    work = tmp_path / "hostile-work"
    git("clone", "--quiet", str(repo), str(work), cwd=tmp_path)
    with open(work / "kernel.py", "a") as f:
        f.write("\n" + ESCAPES + "\n\n_escape()\n")
    diff = git("diff", cwd=work)
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "09-hostile.patch").write_text(
        "Title: cache warm-up in kernel.py\nHypothesis: kernel.py can prepare its buffers once at import.\n\n" + diff)
    return tmp_path / "patches"


@pytest.mark.slow
def test_in_a_real_session_hostile_code_reaches_nothing_outside(outside, tmp_path, listener, monkeypatch):
    spec_path = load_make_demo().make_demo(outside / "demo", points=150, repeats=1, min_pairs=5, max_pairs=7)
    repo = outside / "demo" / "checkout"
    raw = yaml.safe_load(spec_path.read_text())
    raw["custom"]["patches"]["dir"] = str(_hostile_patch(outside, repo))
    script = outside / "specialist.py"
    script.write_text(SPECIALIST)
    raw["custom"]["patches"]["command"] = [sys.executable, str(script), str(PATCHES / "01-vectorize-distances.patch")]
    spec_path.write_text(yaml.safe_dump(raw))
    d = outside / "session"
    home = Path.home() / f"inferloom-escape-{uuid.uuid4().hex}"
    private_tmp = Path("/tmp") / f"inferloom-escape-{uuid.uuid4().hex}"
    targets = [repo / "bench.py", repo / ".git" / "HEAD", home, tmp_path / "outside.txt", private_tmp,
               d / "ledger.jsonl", d / "workspace" / "trees" / "stack" / "bench.py", d / "workspace" / "repo.git" / "HEAD"]
    monkeypatch.setenv("ESCAPE_PATHS", ":".join(map(str, targets)))
    monkeypatch.setenv("ESCAPE_PORT", str(listener.getsockname()[1]))
    before = checksums(outside / "demo", skip=(repo / ".git",)), (repo / ".git" / "HEAD").read_bytes()
    try:
        st = start(d, load_spec(spec_path), budget_minutes=10, max_trials=3, agents=_agents(), kb_url=None,
                   sweep=False)
        assert not home.exists() and not private_tmp.exists()
    finally:
        home.unlink(missing_ok=True)
    assert st.phase == Phase.DONE
    # (the checkout's .git gains the session branch: a fetch by inferloom itself; its HEAD is the same)
    assert (checksums(outside / "demo", skip=(repo / ".git",)), (repo / ".git" / "HEAD").read_bytes()) == before
    assert not (tmp_path / "outside.txt").exists()
    assert _nothing_connected(listener)
    entries = L.read_entries(d)
    patches = {e["id"]: e for e in entries if e["kind"] == "patch"}
    assert patches["09-hostile"]["kept"] is False
    # the Specialist ran sandboxed (every escape blocked, else it would have failed) and its patch was kept
    assert patches["specialist-01"]["kept"] is True
    assert not [e for e in entries if e["kind"] == L.REFUSAL and e["rule"] == "patch_source_failed"]
    # what the hostile patch saw, run after run: every write blocked (its private /tmp aside), no connection
    tails = [r["extra"].get("stderr_tail") or "" for e in entries if e["kind"] == L.MEASUREMENT
             for p in (e.get("protocol") or {}).get("pairs", []) for r in (p.get("a") or {}, p.get("b") or {})
             if "blocked connect" in ((r.get("extra") or {}).get("stderr_tail") or "")]
    assert tails, "the hostile patch never ran"
    for t in tails:
        assert "CONNECTED" not in t and [x for x in t.splitlines() if x.startswith("WROTE")] == [f"WROTE {private_tmp}"]
        assert "Read-only file system" in t
    sb = [e for e in entries if e["kind"] == "sandbox"]
    assert len(sb) == 1 and sb[0]["mode"] == "bwrap"
    assert json.loads((d / "manifest.json").read_text())["adapter"]["sandbox"]["mode"] == "bwrap"
    assert "**Sandbox: bubblewrap**" in (d / "report.md").read_text()


# -- dies with inferloom -------------------------------------------------------------------------------------------

def _pids_with(marker):
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if marker in (p / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def test_a_sandboxed_entrypoint_dies_with_inferloom(tmp_path):
    git_repo(tmp_path / "repo", {"run.py": "import time\ntime.sleep(600)\n"})
    marker = f"{time.time_ns() % 10**9}.{os.getpid()}"
    child = textwrap.dedent(f'''
        import sys
        from inferloom.spec import WorkloadSpec
        from inferloom.workloads.custom import CustomAdapter
        spec = WorkloadSpec.model_validate({{"framework": "custom", "device": "cpu", "custom": {{
            "repo": {str(tmp_path / "repo")!r}, "entrypoint": ["sleep", "{marker}"], "timeout_s": 600,
            "patches": {{"dir": {str(tmp_path)!r}}}}}}})
        a = CustomAdapter(spec)
        assert a.sandbox is not None
        a.run(a.prepare({{}}), 1)
    ''')
    proc = subprocess.Popen([sys.executable, "-c", child], env={**os.environ, "PYTHONPATH": SRC})
    try:
        deadline = time.time() + 30
        while not [p for p in _pids_with(marker) if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"]:
            assert proc.poll() is None and time.time() < deadline, "the sandboxed entrypoint never started"
            time.sleep(0.1)
        sleeper = next(p for p in _pids_with(marker) if Path(f"/proc/{p}/comm").read_text().strip() == "sleep")
        assert os.readlink(f"/proc/{sleeper}/ns/pid") != os.readlink("/proc/self/ns/pid")  # its own PID namespace
        assert os.readlink(f"/proc/{sleeper}/ns/net") != os.readlink("/proc/self/ns/net")  # and network
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # inferloom dies, no clean-up of its own
        proc.wait()
    deadline = time.time() + 10
    while _pids_with(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert _pids_with(marker) == [], "a sandboxed process outlived inferloom"


# -- without bubblewrap: refuse, or run with the recorded opt-out -------------------------------------------------

def _patch_spec(tmp_path, **custom):
    patches = tmp_path / "patches"
    patches.mkdir(exist_ok=True)
    (patches / "01-touch-run.patch").write_text(
        "Title: edit run.py\nHypothesis: run.py\n\n--- a/run.py\n+++ b/run.py\n@@ -1 +1,2 @@\n \n+# faster\n")
    spec = tiny_custom_spec(tmp_path, patches={"dir": str(patches), "allowlist": ["*.py"]}, **custom)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec.to_dict()))
    return path


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "inferloom.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC, **(env or {})}, timeout=300)


def test_without_bubblewrap_a_patch_session_refuses_to_start(tmp_path):
    spec = _patch_spec(tmp_path)
    res = _cli("optimize", str(spec), "--budget-minutes", "1", "--max-trials", "1", "--out", str(tmp_path / "s"),
               env={ENV_BINARY: str(tmp_path / "no-bwrap")})
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    line = res.stderr.strip().splitlines()[-1]  # (after the progress line naming the directory)
    assert line.startswith("inferloom optimize: error: custom workload with patches: bubblewrap can't run here")
    assert "apt-get install bubblewrap" in line
    assert "custom.sandbox: none" in line
    assert not (tmp_path / "s" / "state.json").exists() and not (tmp_path / "s" / "ledger.jsonl").exists()


def test_a_bubblewrap_that_cannot_run_is_detected(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_BINARY, "/bin/false")  # present, but a sandboxed `true` fails (as where namespaces are forbidden)
    assert probe("/bin/false")[0].startswith("a sandboxed `true` failed")
    with pytest.raises(SandboxUnavailable, match="custom.sandbox: none"):
        resolve("bwrap", patches=True)
    sb, rec = resolve("bwrap", patches=False)  # no patches: only the user's own code runs
    assert sb is None and rec["mode"] == "none" and not rec["patches"]


def test_the_opt_out_runs_and_is_recorded_in_the_manifest_and_the_report(tmp_path):
    spec = _patch_spec(tmp_path, sandbox="none")
    d = tmp_path / "s"
    res = _cli("optimize", str(spec), "--budget-minutes", "2", "--max-trials", "1", "--no-kb", "--no-sweep",
               "--out", str(d), env={ENV_BINARY: str(tmp_path / "no-bwrap")})
    assert res.returncode == 0, res.stderr
    box = json.loads((d / "manifest.json").read_text())["adapter"]["sandbox"]
    assert box["mode"] == "none" and box["patches"] is True and "custom.sandbox: none" in box["reason"]
    entry = next(e for e in L.read_entries(d) if e["kind"] == "sandbox")
    assert entry["mode"] == "none"
    report = (d / "report.md").read_text()
    assert f"**Patches ran without a sandbox**: custom.sandbox: none in the spec" in report
    assert f"ledger #{entry['seq']}" in report
    assert _cli("report", str(d), "--html").returncode == 0
    assert "Patches ran without a sandbox" in (d / "report.html").read_text()


def test_a_program_under_a_hidden_directory_still_starts(tmp_path):
    """The sandbox's private /tmp hides the host's: a program (or a virtualenv) that lives under /tmp is
    bound back read-only, so it starts, and it still can't write there (a CI clone under /tmp ran no
    sandboxed command before this)."""
    sb, _ = resolve("bwrap", patches=True)
    tool = tmp_path / "tools" / "probe.sh"  # tmp_path lies under /tmp
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho started\ntouch \"$(dirname \"$0\")/written\" 2>/dev/null || echo read-only\n")
    tool.chmod(0o755)
    assert str(tool).startswith("/tmp/")
    tree = tmp_path / "tree"
    tree.mkdir()
    res = subprocess.run(sb.wrap([str(tool)], cwd=tree, writable=[tree]), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["started", "read-only"] and not (tool.parent / "written").exists()


def test_inferloom_imports_in_the_sandbox_from_a_source_tree_under_tmp(tmp_path, monkeypatch):
    """An editable install in a clone under /tmp (CI's): the sandboxed re-measure process must still import
    inferloom, read-only (a clean-clone CI run failed on this); the sandbox binds inferloom's own source back."""
    import inferloom.sandbox as S

    src = tmp_path / "src"
    shutil.copytree(Path(S.__file__).resolve().parent, src / "inferloom",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(S, "_OWN_SOURCE", str(src))
    sb, _ = resolve("bwrap", patches=True)
    code = "import inferloom.sandbox as s, os; print(s.__file__); print(os.access(s.__file__, os.W_OK))"
    # -S: no site (no editable finder); it starts in src/, first on sys.path: hidden /tmp unless bound back
    res = subprocess.run(sb.wrap([sys.executable, "-S", "-c", code], cwd=src), capture_output=True, text=True,
                         timeout=60, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(src / "inferloom" / "sandbox.py"), "False"], res.stdout
