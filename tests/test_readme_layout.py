"""The README's Layout section matches the code: every package and top-level module
under src/inferloom is named there, and every src/inferloom path it names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "src" / "inferloom"


def _layout() -> str:
    """The Layout section's code block."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, "README.md's Layout section has no code block"
    return block.group(1)


def _named_paths(layout: str) -> set[str]:
    """The paths the Layout names in its first column, relative to src/inferloom
    (``kernels/catalog/``, ``measure/protocol.py``, ``cli.py``)."""
    lines = layout.splitlines()
    assert lines[0].strip() == "src/inferloom/", lines[0]
    named = set()
    for line in lines[1:]:
        m = re.match(r"^  (\S+)", line)  # an entry starts two spaces in; a continuation line many more
        if m:
            named.add(m.group(1))
    return named


def _mentioned(layout: str) -> set[str]:
    """Every ``word.py`` and ``word/`` the Layout mentions anywhere (first column or description)."""
    return set(re.findall(r"[\w/]*\w+\.py|[\w/]*\w+/", layout))


def test_every_package_and_top_level_module_is_in_the_layout():
    layout = _layout()
    named = _named_paths(layout)
    packages = sorted(str(p.parent.relative_to(PKG)) + "/" for p in PKG.rglob("__init__.py") if p.parent != PKG)
    missing = [p for p in packages if p not in named]
    assert not missing, f"packages not in README.md's Layout: {missing}"
    mentioned = _mentioned(layout)
    modules = sorted(p.name for p in PKG.glob("*.py"))
    missing = [m for m in modules if m not in named and m not in mentioned]
    assert not missing, f"top-level modules not in README.md's Layout: {missing}"


def test_every_path_the_layout_names_exists():
    named = _named_paths(_layout())
    assert named, "the Layout names nothing"
    gone = sorted(p for p in named if not (PKG / p).exists())
    assert not gone, f"README.md's Layout names paths that don't exist under src/inferloom: {gone}"


def test_every_file_the_layout_mentions_exists():
    """A module named in a description (``transformers_knobs.py``, ``phases/custom.py``) exists too: in the
    entry's own folder, at the path given, or at the package root."""
    layout = _layout()
    gone = []
    folder = ""
    for line in layout.splitlines()[1:]:
        m = re.match(r"^  (\S+)", line)
        if m:
            first = m.group(1)
            folder = first if first.endswith("/") else (first.rsplit("/", 1)[0] + "/" if "/" in first else "")
        for name in re.findall(r"[\w/]*\w+\.py", line):
            if not any((PKG / base / name).exists() for base in (folder, "")):
                gone.append(name)
    assert not gone, f"README.md's Layout mentions files that don't exist: {sorted(set(gone))}"
