"""Zero, in place, the payloads of the CUDA fat-binary entries of a shared library that are for other GPU
architectures than the ones kept (issue 32: SGLang's FA3 library for the H200, sm90 only).

    python3 benchmarks/fatbin_keep_arch.py sgl_kernel/flash_ops.abi3.so --keep 90 [--dry-run]

A fat binary (``.nv_fatbin``) is a series of containers (magic 0xBA55ED50, version 1, a 16-byte header, then
entries); each entry has a header (kind: 1 = PTX, 2 = cubin; its header size, payload size and the SM
architecture at byte 28) and its payload. The CUDA runtime loads, for a device, an entry of that device's
architecture; a cubin of another major architecture is never loaded there, so its bytes can be zeroed: the
file keeps its size and layout (every header, offset and symbol stays), and xz then packs the zeros to
almost nothing. PTX entries are kept whatever their architecture (a newer device JIT-compiles them). NVIDIA's
own tool for this is ``nvprune`` (CUDA toolkit), not available on the machine that builds the bundle.

Measured on sglang-kernel 0.4.5's ``flash_ops.abi3.so`` (2026-12-04): 1,116 cubin entries, sm80 256.5 MiB,
sm86 256.5 MiB, sm90 473.9 MiB (of a 1,071 MiB file). Not yet loaded on the H200 after pruning: the
device session's ``check`` step imports ``sgl_kernel.flash_attn`` when the add-on is there.
"""

from __future__ import annotations

import argparse
import mmap
import struct
import sys
from collections import Counter
from pathlib import Path

MAGIC = 0xBA55ED50
CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries that follow
ENTRY = struct.Struct("<HHIQ")  # kind, flags, header size, payload size (the arch is a u32 at byte 28)
KINDS = {1: "ptx", 2: "cubin"}


def entries(buf: bytes | mmap.mmap) -> list[tuple[int, int, int, int]]:
    """``(kind, arch, payload offset, payload size)`` of every entry of every well-formed container in ``buf``
    (a container's header and entries must add up exactly, so stray magic bytes are skipped)."""
    found: list[tuple[int, int, int, int]] = []
    pos = buf.find(struct.pack("<I", MAGIC))
    while pos >= 0:
        nxt = pos + 4
        if pos + CONTAINER.size <= len(buf):
            _, version, hsz, size = CONTAINER.unpack_from(buf, pos)
            start, stop = pos + hsz, pos + hsz + size
            mine: list[tuple[int, int, int, int]] = []
            e = start
            while version == 1 and hsz == 16 and stop <= len(buf) and e + 32 <= stop:
                kind, _flags, ehs, psz = ENTRY.unpack_from(buf, e)
                if kind not in KINDS or ehs < 32 or e + ehs + psz > stop:
                    break
                mine.append((kind, struct.unpack_from("<I", buf, e + 28)[0], e + ehs, psz))
                e += ehs + psz
            if mine and e == stop:
                found += mine
                nxt = stop
        pos = buf.find(struct.pack("<I", MAGIC), nxt)
    return found


def prune(path: str | Path, keep: set[int], dry_run: bool = False) -> dict[str, Counter]:
    """Zero the cubin payloads of ``path`` whose architecture is not in ``keep``; ``{"kept", "zeroed"}``: bytes by
    ``kind/sm`` (e.g. ``cubin/sm80``)."""
    out: dict[str, Counter] = {"kept": Counter(), "zeroed": Counter()}
    with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as m:
        for kind, arch, off, size in entries(m):
            label = f"{KINDS[kind]}/sm{arch}"
            if kind == 2 and arch not in keep:
                out["zeroed"][label] += size
                if not dry_run:
                    m[off:off + size] = bytes(size)
            else:
                out["kept"][label] += size
        if not dry_run:
            m.flush()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("library")
    ap.add_argument("--keep", required=True, help="architectures to keep, comma-separated (e.g. 90 or 90,100)")
    ap.add_argument("--dry-run", action="store_true", help="say what would be zeroed, change nothing")
    a = ap.parse_args(argv)
    try:
        keep = {int(x) for x in a.keep.split(",")}
    except ValueError:
        ap.error(f"--keep {a.keep}: expected SM numbers such as 90 or 90,100")
    if not Path(a.library).is_file():
        ap.error(f"{a.library}: no such file")
    res = prune(a.library, keep, a.dry_run)
    mib = {k: {lab: round(v / 2**20, 1) for lab, v in sorted(c.items())} for k, c in res.items()}
    if not res["kept"] and not res["zeroed"]:
        print(f"fatbin_keep_arch: {a.library}: no fat binary found, nothing changed")
        return 0
    verb = "would zero" if a.dry_run else "zeroed"
    print(f"fatbin_keep_arch: {a.library}: kept {mib['kept']} MiB, {verb} {mib['zeroed']} MiB")
    if not any(lab.endswith(tuple(f"/sm{k}" for k in keep)) for lab in res["kept"]):
        print(f"fatbin_keep_arch: warning: no entry for sm{'/'.join(map(str, sorted(keep)))} in {a.library}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
