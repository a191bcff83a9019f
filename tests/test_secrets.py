"""No secret reaches the disk (inferloom.redact): one test per kind of secret,
each a real short session of the synthetic adapter through the CLI, then every
file the session directory holds, the KB export and the printed output are
searched for the secret."""

import json
from pathlib import Path

import pytest

from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.cli import main
from inferloom.phases.runner import KBPasswordMissing, resume, start
from inferloom.redact import REDACTED, has_redacted_password, is_secret_name, redact, redact_env, redact_text
from inferloom.session import ledger as L
from inferloom.session.manifest import run_env
from inferloom.session.state import Phase, load_state
from inferloom.spec import load_spec
from inferloom.workloads.synthetic import SyntheticAdapter

SESSION = ["optimize", "--model", "llama-tiny", "--framework", "synthetic", "--device", "cpu", "--seed", "3",
           "--budget-minutes", "5", "--max-trials", "3", "--no-sweep"]


def _pg_url(secret):
    """A PostgreSQL URL with a password, on a port nothing listens on: the KB can't be
    opened (no driver, or the connection is refused), so every error path that
    names the KB (state, ledger, report, progress) is exercised too."""
    return f"postgresql://inferloom:{secret}@127.0.0.1:1/kb"


def _assert_nowhere(secret, d, *more_files, text=""):
    files = [p for p in Path(d).rglob("*") if p.is_file()] + [Path(f) for f in more_files]
    assert len(files) >= 5  # state, ledger, manifest, report.md, breakdown (and the export)
    leaks = [str(p) for p in files if secret.encode() in p.read_bytes()]
    assert not leaks, f"the secret is written in {leaks}"
    assert secret not in text


def _session(tmp_path, capsys, *extra, kb=None, name="s"):
    d = tmp_path / name
    args = [*SESSION, "--out", str(d), *extra] + (["--kb", kb] if kb else [])
    assert main(args) == 0
    out = capsys.readouterr()
    assert load_state(d).phase == Phase.DONE
    return d, out.out + out.err


def _export(tmp_path, capsys, kb):
    path = tmp_path / "kb-export.json"
    assert main(["kb", "--kb", kb, "export", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["recipes"]  # the session was filed: the export holds it
    return path, capsys.readouterr().out


def _not_filed(d, secret):
    """The KB could not be used: the ledger and the report say so, the URL without its password."""
    fail = [e for e in L.read_entries(d) if e["kind"] == L.ERROR and e.get("failure") == "kb_write"]
    assert len(fail) == 1 and f"inferloom:{REDACTED}@127.0.0.1:1" in fail[0]["error"]
    assert "Not filed in the knowledge base" in (d / "report.md").read_text()


def test_url_password_in_INFERLOOM_KB(tmp_path, capsys, monkeypatch):
    secret = "pw-in-env-Zq81"
    monkeypatch.setenv("INFERLOOM_KB", _pg_url(secret))
    d, printed = _session(tmp_path, capsys)  # the session's KB: $INFERLOOM_KB
    _not_filed(d, secret)
    env = json.loads((d / "manifest.json").read_text())["env"]
    assert env["INFERLOOM_KB"] == f"postgresql://inferloom:{REDACTED}@127.0.0.1:1/kb"  # recorded, redacted
    assert main(["kb", "export", str(tmp_path / "none.json")]) == 2  # the KB can't be opened: one line, no secret
    printed += capsys.readouterr().err
    # and with a KB that works (--kb) while $INFERLOOM_KB still holds the password: the export too
    kb = str(tmp_path / "kb.sqlite")
    d2, printed2 = _session(tmp_path, capsys, kb=kb, name="s2")
    export, printed3 = _export(tmp_path, capsys, kb)
    _assert_nowhere(secret, tmp_path, export, text=printed + printed2 + printed3)


def test_url_password_in_the_kb_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("INFERLOOM_KB", raising=False)
    secret = "pw-on-flag-Xk27"
    d, printed = _session(tmp_path, capsys, kb=_pg_url(secret))
    _not_filed(d, secret)
    stored = load_state(d).extra.run_options.kb_url
    assert stored == f"postgresql://inferloom:{REDACTED}@127.0.0.1:1/kb" and has_redacted_password(stored)
    _assert_nowhere(secret, tmp_path, text=printed)


class _Killed(BaseException):
    pass


def _agents():
    return {"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic, "robustness": RuleRobustness()}


def _interrupted_session(d, kb_url):
    """A synthetic session with knowledge base ``kb_url``, killed at its 30th run (mid-session)."""
    spec = load_spec(None, {"model": "llama-tiny", "framework": "synthetic", "device": "cpu", "seed": 3})

    class Dies(SyntheticAdapter):
        runs = 0

        def run(self, handle, seed):
            Dies.runs += 1
            if Dies.runs == 30:
                raise _Killed()
            return super().run(handle, seed)

    with pytest.raises(_Killed):
        start(d, spec, budget_minutes=5, max_trials=3, adapter=Dies(), agents=_agents(), kb_url=kb_url, sweep=False)
    return d


def test_resume_takes_the_kb_password_from_the_environment(tmp_path, capsys, monkeypatch):
    """state.json keeps the KB URL without its password: resume refuses without
    it (one line, exit 2), then continues with $INFERLOOM_KB's."""
    monkeypatch.delenv("INFERLOOM_KB", raising=False)
    secret = "pw-resume-Mv55"
    kb = _pg_url(secret)
    d = _interrupted_session(tmp_path / "s", kb)
    assert load_state(d).extra.run_options.kb_url == redact_text(kb)
    with pytest.raises(KBPasswordMissing):
        resume(d, adapter=SyntheticAdapter(), agents=_agents())
    assert main(["resume", str(d), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--kb URL" in err and "INFERLOOM_KB" in err
    monkeypatch.setenv("INFERLOOM_KB", kb)
    msgs = []
    st = resume(d, adapter=SyntheticAdapter(), agents=_agents(), progress=msgs.append)
    assert st.phase == Phase.DONE and any("password taken from $INFERLOOM_KB" in m for m in msgs)
    _not_filed(d, secret)  # the KB it used is the real URL (unreachable here), not the redacted one
    _assert_nowhere(secret, d, text="\n".join(msgs))


def test_resume_kb_flag_gives_the_url_again(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("INFERLOOM_KB", raising=False)
    d = _interrupted_session(tmp_path / "s", _pg_url("pw-Ae40"))
    kb = str(tmp_path / "kb.sqlite")  # given again on the command line: used as given
    assert main(["resume", str(d), "--quiet", "--kb", kb]) == 0
    export, printed = _export(tmp_path, capsys, kb)
    _assert_nowhere("pw-Ae40", d, export, text=printed)


# one variable per name family; each is recorded if it were not a secret (the INFERLOOM_ prefix)
FAMILIES = {"KEY": "INFERLOOM_API_KEY", "TOKEN": "INFERLOOM_HF_TOKEN", "SECRET": "INFERLOOM_CLIENT_SECRET",
            "PASS": "INFERLOOM_DB_PASS", "PASSWORD": "INFERLOOM_DB_PASSWORD", "PASSPHRASE": "INFERLOOM_KB_PASSPHRASE",
            "CREDENTIAL": "INFERLOOM_CREDENTIALS_FILE", "AUTH": "INFERLOOM_AUTH_HEADER"}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_secret_named_environment_variable(family, tmp_path, capsys, monkeypatch):
    name = FAMILIES[family]
    secret = f"value-of-{family.lower()}-Qh93"
    monkeypatch.setenv(name, secret)
    monkeypatch.setenv("INFERLOOM_CONTROL_VALUE", "control-Pw70")  # not a secret: recorded (the search can see)
    monkeypatch.delenv("INFERLOOM_KB", raising=False)
    kb = str(tmp_path / "kb.sqlite")
    d, printed = _session(tmp_path, capsys, kb=kb)
    export, printed2 = _export(tmp_path, capsys, kb)
    _assert_nowhere(secret, d, export, text=printed + printed2)
    assert b"control-Pw70" in (d / "manifest.json").read_bytes()


def test_redaction_rules():
    assert redact_text("postgresql://user:PASSWORD@host/db") == "postgresql://user:***@host/db"
    assert redact_text("KB postgresql://u:p@ss@h:5/db failed") == "KB postgresql://u:***@h:5/db failed"
    assert redact_text("postgresql://u@h/db?sslpassword=zz&x=1") == "postgresql://u@h/db?sslpassword=***&x=1"
    for clean in ("http://127.0.0.1:8000/v1", "sqlite:////tmp/kb.sqlite", "a=b", "llama-tiny"):
        assert redact_text(clean) == clean
    assert redact({"a": ["mysql://r:s3@h/d", 1.5, None], "b": {"c": "x"}}) == {"a": ["mysql://r:***@h/d", 1.5, None],
                                                                               "b": {"c": "x"}}
    assert all(is_secret_name(n) for n in FAMILIES.values()) and not is_secret_name("OMP_NUM_THREADS")
    assert redact_env({"HF_TOKEN": "t", "INFERLOOM_KB": "pg://u:p@h/d"}) == {"HF_TOKEN": REDACTED,
                                                                              "INFERLOOM_KB": "pg://u:***@h/d"}
    env = run_env({"INFERLOOM_KB_PASSPHRASE": "x", "INFERLOOM_KB": "pg://u:p@h/d", "CUDA_VISIBLE_DEVICES": "0"})
    assert env == {"INFERLOOM_KB": "pg://u:***@h/d", "CUDA_VISIBLE_DEVICES": "0"}
    assert has_redacted_password("pg://u:***@h/d") and not has_redacted_password("pg://u:p@h/d")
    assert not has_redacted_password(None) and not has_redacted_password("/tmp/kb.sqlite")


def test_a_query_password_in_a_kb_url_reaches_neither_the_error_nor_the_fleet_log(tmp_path, monkeypatch):
    """`?password=...` (not only user:password@) is hidden in the KB's errors and in a fleet session's log,
    where the KB's retry warnings go (issue 30 item 7)."""
    import logging

    from inferloom.fleet.worker import _kb_log
    from inferloom.kb.db import Database, KBUnavailable

    monkeypatch.setenv("INFERLOOM_KB_RETRY_S", "1")
    log = tmp_path / "fleet.log"
    with log.open("w") as f, _kb_log(f):
        logging.getLogger("inferloom.kb").warning("KB %s: retry", "postgresql://u@h/kb?password=hunter2")
        with pytest.raises(KBUnavailable) as exc:
            Database("postgresql+psycopg://u@127.0.0.1:1/kb?password=hunter2")
    assert "hunter2" not in str(exc.value) and "password=***" in str(exc.value)
    assert "hunter2" not in log.read_text() and "password=***" in log.read_text()
