"""benchmarks/fatbin_keep_arch.py on a synthetic fat binary built here with the container and entry layout it
parses (the layout read from sglang-kernel 0.4.5's flash_ops.abi3.so on 2026-12-04: 1,116 cubin entries for
sm80/86/90): it zeroes the other architectures' cubins in place, keeps PTX, the kept cubins and every byte
around them, and skips stray magic bytes."""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("fatbin_keep_arch", ROOT / "benchmarks" / "fatbin_keep_arch.py")
fk = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(fk)


def _entry(kind: int, arch: int, payload: bytes) -> bytes:
    head = struct.pack("<HHIQ", kind, 0x11, 64, len(payload)) + bytes(12) + struct.pack("<I", arch)  # arch at 28
    return head + bytes(64 - len(head)) + payload


def _container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", fk.MAGIC, 1, 16, len(body)) + body


def _library(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    p = {k: os.urandom(n) for k, n in (("sm80", 300), ("sm86", 200), ("sm90", 500), ("ptx80", 100))}
    stray = struct.pack("<I", fk.MAGIC) + b"\x07\x00"  # the magic in other data: not a container
    blob = (b"ELF-ish head" + stray + os.urandom(50) + _container(_entry(2, 80, p["sm80"]), _entry(2, 90, p["sm90"]))
            + b"between" + _container(_entry(2, 86, p["sm86"]), _entry(1, 80, p["ptx80"])) + b"tail")
    f = tmp_path / "lib.so"
    f.write_bytes(blob)
    return f, p


def test_other_architectures_cubins_are_zeroed_in_place_and_the_rest_is_untouched(tmp_path):
    f, p = _library(tmp_path)
    before = f.read_bytes()
    res = fk.prune(f, {90})
    after = f.read_bytes()
    assert len(after) == len(before)
    assert dict(res["zeroed"]) == {"cubin/sm80": 300, "cubin/sm86": 200}
    assert dict(res["kept"]) == {"cubin/sm90": 500, "ptx/sm80": 100}
    assert p["sm90"] in after and p["ptx80"] in after and p["sm80"] not in after and p["sm86"] not in after
    changed = sum(a != b for a, b in zip(before, after))
    assert 0 < changed <= 500  # only the two zeroed payloads changed
    assert after.replace(bytes(300), b"").replace(bytes(200), b"")  # headers, offsets and the rest stay


def test_dry_run_changes_nothing_and_a_file_without_a_fat_binary_is_said_so(tmp_path, capsys):
    f, _ = _library(tmp_path)
    before = f.read_bytes()
    assert dict(fk.prune(f, {90}, dry_run=True)["zeroed"]) == {"cubin/sm80": 300, "cubin/sm86": 200}
    assert f.read_bytes() == before
    plain = tmp_path / "plain.so"
    plain.write_bytes(os.urandom(1000))
    assert fk.main([str(plain), "--keep", "90"]) == 0 and "no fat binary found" in capsys.readouterr().out


def test_bad_arguments_are_one_line_exit_2(tmp_path):
    f, _ = _library(tmp_path)
    for args in ([str(f), "--keep", "sm90"], [str(tmp_path / "absent.so"), "--keep", "90"]):
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fatbin_keep_arch.py"), *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].count("error") == 1
