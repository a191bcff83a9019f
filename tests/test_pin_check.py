"""A handed-over session's pins before pip (issue 30, item 2): hostile names and versions refused with the rule
they break, nothing installed when one is bad, wheels only, and pip's environment without secrets."""

import io
import json
import subprocess
import sys
import tarfile

import pytest
from hypothesis import given, settings, strategies as st

from inferloom.errors import InferloomError
from inferloom.evidence import rebuild as R
from inferloom.evidence.pin_check import PinError, check_pin, check_pins
from inferloom.redact import is_secret_name, without_secrets

# (name, version, a piece of the rule the pin breaks)
HOSTILE = [
    ("evilpkg @ file:///DIR", "1.0", "contains '@'"),
    ("--index-url=http://127.0.0.1:8123/simple#", "1.0", "starts with '-'"),
    ("--dry-run", "1.0", "starts with '-'"),
    ("-e", "1.0", "starts with '-'"),
    ("evil;python_version>'3'", "1.0", "contains ';'"),
    ("../evil", "1.0", "contains '/'"),
    ("file:evil", "1.0", "contains ':'"),
    ("numpy\n", "2.1.3", "contains whitespace"),
    ("numpy --pre", "2.1.3", "contains whitespace"),
    ("numpy\t", "2.1.3", "contains whitespace"),
    ("numpy==2.1.3", "2.1.3", "is not a package name"),
    ("numpy[extra]", "2.1.3", "is not a package name"),
    ("numpy-", "2.1.3", "is not a package name"),
    ("_numpy", "2.1.3", "is not a package name"),
    ("nümpy", "2.1.3", "is not a package name"),
    ("", "2.1.3", "name is empty"),
    (42, "2.1.3", "name is not a string"),
    ("numpy", "1.0 ; os_name=='nt'", "version contains ';'"),
    ("numpy", "1.0@file:///x", "version contains '@'"),
    ("numpy", "-1", "version starts with '-'"),
    ("numpy", "--dry-run", "version starts with '-'"),
    ("numpy", " 2.1.3", "version contains whitespace"),  # Version() would strip it: refused as written
    ("numpy", "2.1.3\n", "version contains whitespace"),
    ("numpy", "latest", "not a PEP 440 version"),
    ("numpy", ">=1.0", "not a PEP 440 version"),
    ("numpy", "1.*", "not a PEP 440 version"),
    ("numpy", 2.1, "version is not a string"),
    ("numpy", None, "version is not a string"),
]

GOOD = [("numpy", "2.1.3"), ("pydantic-core", "2.27.1"), ("typing_extensions", "4.12.2"), ("zope.interface", "7.0"),
        ("a", "1"), ("torch", "2.13.0+cpu"), ("pkg", "1!2.0.post1.dev3"), ("Flask", "3.0.0rc1"), ("x9", "0")]


@pytest.mark.parametrize("name,version,rule", HOSTILE, ids=[ascii(h[:2]) for h in HOSTILE])
def test_a_hostile_pin_is_refused_naming_it_and_the_rule(name, version, rule):
    with pytest.raises(PinError) as e:
        check_pin(name, version)
    msg = str(e.value)
    assert isinstance(e.value, InferloomError) and e.value.exit_code == 2
    assert rule in msg and "not trusted" in msg and "nothing was installed" in msg
    assert "\n" not in msg and "\r" not in msg  # one line, whatever the pin holds
    assert ascii(name)[:40] in msg if isinstance(name, str) else str(name) in msg
    assert len(e.value.refused) == 1 and rule in e.value.refused[0][1]


@pytest.mark.parametrize("name,version", GOOD)
def test_a_plain_pin_is_accepted(name, version):
    check_pin(name, version)
    check_pins([{"name": name, "version": version, "files_sha256": "0" * 64}])


def test_every_refused_pin_is_listed_in_one_error():
    pkgs = [{"name": "numpy", "version": "2.1.3"}, {"name": "evilpkg @ file:///DIR", "version": "1"},
            {"name": "--dry-run", "version": "1"}, "not an object", {"name": "ok", "version": "junk!"}]
    with pytest.raises(PinError) as e:
        check_pins(pkgs)
    assert [r[0].split("==")[0] for r in e.value.refused] == ["'evilpkg @ file:///DIR'", "'--dry-run'",
                                                               "'not an object'", "'ok'"]
    assert "pins refused (4)" in str(e.value) and "numpy" not in str(e.value)


def test_a_long_hostile_name_is_cut_in_the_message():
    with pytest.raises(PinError) as e:
        check_pin("a" * 5000 + "@x", "1")
    assert len(str(e.value)) < 1000


_names = st.text(alphabet=st.characters(codec="utf-8"), max_size=30) | st.from_regex(
    r"[-A-Za-z0-9._@/:; \t\n]{0,20}", fullmatch=True)


@settings(max_examples=400, deadline=None)
@given(_names, st.sampled_from(["1.0", "2.1.3", "1!0.1.post2"]))
def test_an_accepted_name_is_never_more_than_a_package_name(name, version):
    try:
        check_pin(name, version)
    except PinError:
        return
    assert not name.startswith("-") and not any(c in name for c in "@/:;")
    assert not any(c.isspace() for c in name) and name.isascii() and name
    assert subprocess.list2cmdline([f"{name}=={version}"]) == f"{name}=={version}"  # one plain word


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=20))
def test_an_accepted_version_is_never_more_than_a_version(version):
    try:
        check_pin("pkg", version)
    except PinError:
        return
    assert not version.startswith("-") and not any(c in version for c in "@/:;")
    assert not any(c.isspace() for c in version)


def test_the_environment_pip_gets_has_no_secrets(monkeypatch):
    env = {"OPENAI_API_KEY": "sk-x", "HF_TOKEN": "hf_x", "PATH": "/usr/bin", "HOME": "/home/u", "aws_secret": "s",
           "PGPASSWORD": "p", "MY_PASSWD": "p", "GOOGLE_APPLICATION_CREDENTIALS": "/c.json", "GH_AUTH": "a",
           "PIP_INDEX_URL": "https://pypi.org/simple", "LANG": "C.UTF-8"}
    got = without_secrets(env)
    assert got == {"PATH": "/usr/bin", "HOME": "/home/u", "PIP_INDEX_URL": "https://pypi.org/simple", "LANG": "C.UTF-8"}
    assert env["OPENAI_API_KEY"] == "sk-x"  # a copy
    assert is_secret_name("hf_token") and not is_secret_name("PATH")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    child = R._child_env()
    assert "OPENAI_API_KEY" not in child and "HF_TOKEN" not in child and "PYTHONPATH" not in child
    assert child["PATH"] == __import__("os").environ["PATH"]


def _session(tmp_path, packages):
    d = tmp_path / "session"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"schema_version": 1, "pins": {
        "python": {"version": "%d.%d.%d" % sys.version_info[:3]}, "packages": packages}}))
    return d


def test_rebuild_refuses_a_hostile_manifest_before_any_virtualenv_or_pip(tmp_path):
    pkgs = [{"name": "numpy", "version": "2.1.3"}, {"name": "evilpkg @ file:///DIR", "version": "1.0"},
            {"name": "--index-url=http://127.0.0.1:9/simple#", "version": "1.0"}, {"name": "--dry-run", "version": "1"}]
    venv = tmp_path / "venv"
    with pytest.raises(PinError) as e:
        R.rebuild(_session(tmp_path, pkgs), venv=venv, only=["numpy"])  # refused even when left out by only
    assert "pins refused (3)" in str(e.value) and not venv.exists()


def test_install_pins_checks_what_becomes_pips_arguments(tmp_path):
    missing = tmp_path / "no-venv" / "bin" / "python"  # pip is never reached: running it would fail otherwise
    with pytest.raises(PinError, match="starts with '-'"):
        R.install_pins(missing, [{"name": "--dry-run", "version": "1"}])


def _sdist(where, name, marker):
    """An sdist with an in-tree build backend (no build dependency: it builds even offline) that writes
    ``marker`` when pip imports it: only wheels may be installed, so it must never run."""
    files = {"pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
             "backend.py": f"open({str(marker)!r}, 'w').write('ran')\n"
                           "def get_requires_for_build_wheel(config_settings=None):\n    return []\n",
             "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"}
    path = where / f"{name}-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-1.0/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_only_wheels_are_installed_no_build_backend_runs(tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    marker = tmp_path / "backend-ran"
    _sdist(links, "evilsdist", marker)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, env=R._child_env())
    with pytest.raises(R.RebuildError, match="pin evilsdist==1.0 can't be installed"):
        R.install_pins(venv / "bin" / "python", [{"name": "evilsdist", "version": "1.0"}], find_links=[links],
                       no_index=True)
    assert not marker.exists()


@settings(max_examples=400, deadline=None)
@given(st.from_regex(r"v?([0-9]!)?[0-9]{1,3}(\.[0-9]{1,3}){0,3}([-_.]?(a|b|rc|pre|post|r|dev)[-_.]?[0-9]{0,2}){0,3}"
                     r"(\+[a-z0-9]{1,4}([-_.][a-z0-9]{1,3}){0,2})?", fullmatch=True) | st.text(max_size=12))
def test_the_pattern_used_without_packaging_agrees_with_packaging(version):
    from packaging.version import InvalidVersion, Version

    from inferloom.evidence.pin_check import VERSION_PATTERN

    try:
        Version(version)
        ok = True
    except InvalidVersion:
        ok = False
    if version == version.strip():
        assert bool(VERSION_PATTERN.fullmatch(version)) == ok, version


def test_without_packaging_the_same_versions_are_refused(monkeypatch):
    from inferloom.evidence import pin_check

    monkeypatch.setattr(pin_check, "Version", None)
    monkeypatch.setattr(pin_check, "InvalidVersion", ValueError)
    for name, version in GOOD:
        check_pin(name, version)
    for version in ("latest", ">=1.0", "1.*", "1.0.0-", "1..0"):
        with pytest.raises(PinError, match="not a PEP 440 version"):
            check_pin("numpy", version)
