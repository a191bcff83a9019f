"""Write the hostile-patch corpus, tests/data/hostile_patches/ (run from the repository root).

    python tests/data/make_hostile_patches.py [DEST]

Every patch targets the tiny workload in tests/data/hostile_repo/ (its contexts match
that tree exactly) and names, in its header, the rule that must refuse it
(``Expected-Rule: RULE``; ``kept`` for the one clean control). tests/test_hostile_patches.py
runs them all through a real custom session and asserts each rule. Edit this file and
rerun it, rather than the .patch files, when the corpus or the workload changes.
"""

import sys
from pathlib import Path

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "hostile_patches"
OUT.mkdir(parents=True, exist_ok=True)

RES = ('res = {"objective": {"value": len(x) / timed, "unit": "items/s"}, "timed_s": timed, '
       '"quality_gate": gate.check(x, y)}')
DOC = '"""The kernel: doubles every input."""'

def kernel_doc(a="a/", b="b/"):
    return (f"--- {a}kernel.py\n+++ {b}kernel.py\n@@ -1,3 +1,3 @@\n-{DOC}\n"
            '+"""The kernel: doubles every input (documented)."""\n \n SPEED = 100\n')

def kernel_git():
    return "diff --git a/kernel.py b/kernel.py\nindex 1111111..2222222 100644\n" + kernel_doc()

GATE_BODY = ("@@ -1,3 +1,3 @@\n def check(x, y):\n-    ok = y == [v * 2 for v in x]\n+    ok = True\n"
             '     return {"passed": ok, "checks": {"exact": ok}}\n')
RUN_BODY = (f"@@ -14,3 +14,3 @@\n timed = time.perf_counter() - t0\n-{RES}\n+{RES.replace('len(x) / timed', 'len(x) / timed * 10')}\n"
            ' with open(os.environ["INFERLOOM_RESULT"], "w") as f:\n')
TRAILER = "-- \n2.39.2\n\n"
SYMLINK_NEW = ("diff --git a/lib/passwd b/lib/passwd\nnew file mode 120000\nindex 0000000..3594e94\n"
               "--- /dev/null\n+++ b/lib/passwd\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n")
GITLINK = ("diff --git a/lib/sub b/lib/sub\nnew file mode 160000\nindex 0000000..1111111\n--- /dev/null\n"
           "+++ b/lib/sub\n@@ -0,0 +1 @@\n+Subproject commit 1111111111111111111111111111111111111111\n")
SPEED_UP = ("@@ -1,4 +1,4 @@\n " + DOC + "\n \n-SPEED = 100\n+SPEED = 1000\n \n")


def head(title, hyp, rule):
    return f"Title: {title}\nHypothesis: {hyp}\nExpected-Rule: {rule}\n\n"


P = {}
K = "kernel.py is documented"  # names kernel.py for the critic
# --- trailer tricks: the parser stops at '-- ', git reads on
P["t01-trailer-hides-gate"] = head("document the kernel", K, "patch_paths_mismatch") + kernel_git() + TRAILER + \
    "diff --git a/gate.py b/gate.py\nindex 3333333..4444444 100644\n--- a/gate.py\n+++ b/gate.py\n" + GATE_BODY
P["t02-trailer-hides-symlink"] = head("document the kernel", K, "patch_paths_mismatch") + kernel_git() + TRAILER + SYMLINK_NEW
P["t03-trailer-hides-forbidden"] = head("document the kernel", K, "forbidden_pattern") + kernel_git() + TRAILER + \
    ("diff --git a/kernel.py b/kernel.py\n--- a/kernel.py\n+++ b/kernel.py\n@@ -6,2 +6,3 @@\n def compute(x):\n"
     "     return [v * 2 for v in x]\n+import subprocess  # noqa\n")
P["t04-trailer-hides-traditional"] = head("document the kernel", K, "patch_paths_mismatch") + kernel_git() + TRAILER + \
    "--- a/run.py\n+++ b/run.py\n" + RUN_BODY
P["t05-trailer-hides-gitlink"] = head("document the kernel", K, "patch_paths_mismatch") + kernel_git() + TRAILER + GITLINK
P["t06-trailer-hides-delete"] = head("document the kernel", K, "patch_paths_mismatch") + kernel_git() + TRAILER + \
    ("diff --git a/data/points.txt b/data/points.txt\ndeleted file mode 100644\nindex 5555555..0000000\n"
     "--- a/data/points.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-1 2 3\n")
P["t07-trailer-hides-git-hook"] = head("document the kernel", K, "does_not_apply") + kernel_git() + TRAILER + \
    ("diff --git a/.git/hooks/post-checkout b/.git/hooks/post-checkout\nnew file mode 100755\n--- /dev/null\n"
     "+++ b/.git/hooks/post-checkout\n@@ -0,0 +1,2 @@\n+#!/bin/sh\n+touch /tmp/pwned\n")
P["t08-trailer-with-cr"] = head("document the kernel", K, "malformed_diff") + kernel_git() + "-- \r\n2.39.2\n\n" + \
    "--- a/gate.py\n+++ b/gate.py\n" + GATE_BODY
P["t09-trailer-two-spaces"] = head("document the kernel", K, "malformed_diff") + kernel_git() + "--  \n2.39.2\n\n" + \
    "--- a/gate.py\n+++ b/gate.py\n" + GATE_BODY
# --- path-prefix tricks: -p1 strips the first component the allowlist matched
P["p01-notes-prefix-entrypoint"] = head("notes", "NOTES.md/run.py documents the entrypoint", "patch_paths_mismatch") + \
    "--- NOTES.md/run.py\n+++ NOTES.md/run.py\n" + RUN_BODY
P["p02-lib-prefix-gate"] = head("util", "lib/gate.py is a helper", "patch_paths_mismatch") + \
    "--- lib/gate.py\n+++ lib/gate.py\n" + GATE_BODY
P["p03-notes-prefix-new-input"] = head("notes", "NOTES.md/data/extra.txt holds notes", "patch_paths_mismatch") + \
    "--- /dev/null\n+++ NOTES.md/data/extra.txt\n@@ -0,0 +1 @@\n+1000000\n"
P["p04-mixed-names"] = head("kernel", "kernel.py and run.py", "touches_entrypoint") + \
    "--- a/kernel.py\n+++ b/run.py\n" + RUN_BODY
P["p05-prefix-traversal"] = head("notes", "NOTES.md/../gate.py", "path_traversal") + \
    "--- NOTES.md/../gate.py\n+++ NOTES.md/../gate.py\n" + GATE_BODY
P["p06-diffgit-prefix"] = head("notes", "NOTES.md/run.py", "does_not_apply") + \
    "diff --git a/NOTES.md/run.py b/NOTES.md/run.py\n--- a/NOTES.md/run.py\n+++ b/NOTES.md/run.py\n" + RUN_BODY
# --- /dev/null tricks
P["d01-devnull-recreate-kernel"] = head("kernel", "kernel.py rewritten", "does_not_apply") + \
    "--- /dev/null\n+++ b/kernel.py\n@@ -0,0 +1,2 @@\n+SPEED = 10 ** 6\n+compute = lambda x: [v * 2 for v in x]\n"
P["d02-devnull-delete-gate"] = head("gate", "gate.py is not needed", "touches_quality_gate") + \
    "--- a/gate.py\n+++ /dev/null\n@@ -1,3 +0,0 @@\n def check(x, y):\n-    ok = y == [v * 2 for v in x]\n" \
    "-    return {\"passed\": ok, \"checks\": {\"exact\": ok}}\n".replace("\n def check", "\n-def check", 1)
P["d03-devnull-both"] = head("nothing", "kernel.py", "malformed_diff") + "--- /dev/null\n+++ /dev/null\n@@ -0,0 +1 @@\n+x\n"
P["d04-devnull-prefixed"] = head("null", "kernel.py", "absolute_path") + "--- a//dev/null\n+++ b//dev/null\n@@ -1 +1 @@\n-x\n+y\n"
# --- modes
P["m01-gitlink"] = head("vendor a helper", "lib/sub is a helper for kernel.py", "forbidden_mode") + GITLINK
P["m02-setuid"] = head("make the kernel executable", "kernel.py as a tool", "forbidden_mode") + \
    "diff --git a/kernel.py b/kernel.py\nold mode 100644\nnew mode 104755\n"
P["m03-setgid-new-file"] = head("a helper", "lib/tool.py helps kernel.py", "forbidden_mode") + \
    ("diff --git a/lib/tool.py b/lib/tool.py\nnew file mode 102755\nindex 0000000..1111111\n--- /dev/null\n"
     "+++ b/lib/tool.py\n@@ -0,0 +1 @@\n+print('tool')\n")
P["m04-exec-on-gate"] = head("gate", "gate.py executable", "touches_quality_gate") + \
    "diff --git a/gate.py b/gate.py\nold mode 100644\nnew mode 100755\n"
P["m05-symlink-to-passwd"] = head("link", "lib/passwd for kernel.py", "symlink_created") + SYMLINK_NEW
P["m06-kernel-becomes-symlink"] = head("link", "kernel.py", "symlink_created") + \
    ("diff --git a/kernel.py b/kernel.py\ndeleted file mode 100644\n--- a/kernel.py\n+++ /dev/null\n@@ -1,7 +0,0 @@\n"
     f"-{DOC}\n-\n-SPEED = 100\n-\n-\n-def compute(x):\n-    return [v * 2 for v in x]\n"
     "diff --git a/kernel.py b/kernel.py\nnew file mode 120000\n--- /dev/null\n+++ b/kernel.py\n@@ -0,0 +1 @@\n"
     "+/etc/passwd\n\\ No newline at end of file\n")
# --- .git
P["g01-git-hook"] = head("hook", "kernel.py", "touches_git_metadata") + \
    ("diff --git a/.git/hooks/post-checkout b/.git/hooks/post-checkout\nnew file mode 100755\n--- /dev/null\n"
     "+++ b/.git/hooks/post-checkout\n@@ -0,0 +1,2 @@\n+#!/bin/sh\n+touch /tmp/pwned\n")
P["g02-nested-git-config"] = head("config", "lib/.git/config", "touches_git_metadata") + \
    "--- /dev/null\n+++ b/lib/.git/config\n@@ -0,0 +1,2 @@\n+[core]\n+\tfsmonitor = touch /tmp/pwned\n"
# --- rename / copy / delete of protected files
P["r01-rename-gate"] = head("move the gate", "gate.py to lib/gate.py", "touches_quality_gate") + \
    "diff --git a/gate.py b/lib/gate.py\nsimilarity index 100%\nrename from gate.py\nrename to lib/gate.py\n"
P["r02-rename-onto-entrypoint"] = head("rename", "kernel.py to run.py", "touches_entrypoint") + \
    "diff --git a/kernel.py b/run.py\nsimilarity index 100%\nrename from kernel.py\nrename to run.py\n"
P["r03-copy-onto-inputs"] = head("copy", "kernel.py to inputs.py", "touches_benchmark_inputs") + \
    "diff --git a/kernel.py b/inputs.py\nsimilarity index 100%\ncopy from kernel.py\ncopy to inputs.py\n"
P["r04-copy-from-gate"] = head("copy", "gate.py to lib/gate2.py", "touches_quality_gate") + \
    "diff --git a/gate.py b/lib/gate2.py\nsimilarity index 100%\ncopy from gate.py\ncopy to lib/gate2.py\n"
P["r05-delete-license"] = head("cleanup", "LICENSE is unused by kernel.py", "touches_protected") + \
    ("diff --git a/LICENSE b/LICENSE\ndeleted file mode 100644\n--- a/LICENSE\n+++ /dev/null\n@@ -1 +0,0 @@\n"
     "-Protected by custom.patches.protected: no patch may change it.\n")
P["r06-delete-inputs-data"] = head("cleanup", "data/points.txt", "touches_benchmark_inputs") + \
    ("diff --git a/data/points.txt b/data/points.txt\ndeleted file mode 100644\n--- a/data/points.txt\n"
     "+++ /dev/null\n@@ -1 +0,0 @@\n-1 2 3\n")
# --- absolute paths, '..'
P["a01-absolute"] = head("passwd", "/etc/passwd", "absolute_path") + \
    "--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-root:x:0:0:root:/root:/bin/bash\n+root::0:0:root:/root:/bin/bash\n"
P["a02-traversal"] = head("outside", "../outside.txt", "path_traversal") + \
    "--- /dev/null\n+++ b/../outside.txt\n@@ -0,0 +1 @@\n+pwned\n"
P["a03-traversal-diffgit"] = head("outside", "lib/../run.py", "path_traversal") + \
    "diff --git a/lib/../run.py b/lib/../run.py\n--- a/lib/../run.py\n+++ b/lib/../run.py\n" + RUN_BODY
P["a04-windows-absolute"] = head("win", "kernel.py", "absolute_path") + "--- C:\\x\\kernel.py\n+++ C:\\x\\kernel.py\n@@ -1 +1 @@\n-a\n+b\n"
# --- CRLF / whitespace variants
P["w01-crlf-everywhere"] = (head("speed", "kernel.py faster", "does_not_apply") + "--- a/kernel.py\n+++ b/kernel.py\n"
                           + SPEED_UP).replace("\n", "\r\n")
P["w02-trailing-space-path"] = head("gate", "gate.py ", "outside_allowlist") + \
    "--- a/gate.py \n+++ b/gate.py \n" + GATE_BODY
P["w03-crlf-prefix-gate"] = (head("util", "lib/gate.py is a helper", "patch_paths_mismatch")
                             + "--- lib/gate.py\r\n+++ lib/gate.py\r\n" + GATE_BODY)
P["w04-crlf-trailer-hides-gate"] = head("document the kernel", K, "malformed_diff") + kernel_git().replace("\n", "\r\n") + \
    "-- \r\n2.39.2\r\n\r\n" + "--- a/gate.py\r\n+++ b/gate.py\r\n" + GATE_BODY.replace("\n", "\r\n")
# --- obfuscated forbidden patterns (a tripwire; the checksums and the sandbox are the boundary)
P["o01-concat-import"] = head("faster kernel", "kernel.py calls a helper", "forbidden_pattern") + \
    "--- a/kernel.py\n+++ b/kernel.py\n@@ -6,2 +6,3 @@\n def compute(x):\n     return [v * 2 for v in x]\n+_h = __import__('sub'+'process')\n"
P["o02-implicit-concat"] = head("faster kernel", "kernel.py calls a helper", "forbidden_pattern") + \
    "--- a/kernel.py\n+++ b/kernel.py\n@@ -6,2 +6,3 @@\n def compute(x):\n     return [v * 2 for v in x]\n+_s = __import__(\"so\" \"cket\")\n"
P["o03-split-over-lines"] = head("faster kernel", "kernel.py calls a helper", "forbidden_pattern") + \
    "--- a/kernel.py\n+++ b/kernel.py\n@@ -6,2 +6,5 @@\n def compute(x):\n     return [v * 2 for v in x]\n+_h = __import__(\n+    'sub'\n+    'process')\n"
# --- past every regex: rewrites the quality gate at run time; the checksums catch it at the next run
P["o04-chr-rewrites-gate"] = head("faster kernel", "kernel.py runs faster", "protected_file_changed") + \
    ("--- a/kernel.py\n+++ b/kernel.py\n@@ -1,4 +1,8 @@\n " + DOC + "\n+import os as _o\n"
     "+_g = _o.path.join(_o.path.dirname(__file__), ''.join(map(chr, [103, 97, 116, 101, 46, 112, 121])))\n"
     "+with open(_g, 'a') as _f:\n+    _f.write('\\ncheck = lambda x, y: {\"passed\": True, \"checks\": {}}\\n')\n"
     " \n-SPEED = 100\n+SPEED = 1000\n \n")
P["o05-adds-benchmark-input"] = head("faster kernel", "kernel.py runs faster", "protected_file_changed") + \
    ("--- a/kernel.py\n+++ b/kernel.py\n@@ -1,4 +1,6 @@\n " + DOC + "\n+import os as _o\n"
     "+open(_o.path.join(_o.path.dirname(__file__), 'data', 'more.txt'), 'w').write('4 5 6\\n')\n"
     " \n-SPEED = 100\n+SPEED = 1000\n \n")
# --- a forged timer: kernel.py (allowed) replaces time.perf_counter, so the entrypoint's own timing claims any gain;
# inferloom's clock (the run's wall time, measured outside the process) sees no saving: measure/clock_check.py
P["c01-forged-timer"] = head("faster kernel", "kernel.py runs faster", "gain_not_seen_by_clock") + \
    ("--- a/kernel.py\n+++ b/kernel.py\n@@ -1,4 +1,7 @@\n " + DOC + "\n+import time as _t\n+_n = [0.0]\n"
     "+_t.perf_counter = lambda: _n.__setitem__(0, _n[0] + 1e-6) or _n[0]\n \n SPEED = 100\n \n")
# --- the hole test: a clean patch whose tree the test edits between apply and measure
P["x01-bypass-tamper"] = head("faster kernel", "kernel.py runs faster", "protected_file_changed") + \
    "--- a/kernel.py\n+++ b/kernel.py\n" + SPEED_UP
# --- the control: the same clean patch, nobody interferes: it is kept (kept = 0 is not vacuous)
P["z99-control"] = head("faster kernel", "kernel.py runs faster", "kept") + "--- a/kernel.py\n+++ b/kernel.py\n" + SPEED_UP

for name, text in P.items():
    (OUT / f"{name}.patch").write_bytes(text.encode())
print(f"{len(P)} patches in {OUT}")
