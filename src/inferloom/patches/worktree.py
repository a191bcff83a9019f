"""Gate (d)'s isolation: every patch is applied in a tree inferloom owns.

Layout under the session directory (``DIR/workspace``)::

    repo.git/          a bare clone of the user's checkout (their repo is only read)
    trees/stock        detached worktree at the stock commit (the checkout's HEAD at start)
    trees/stack        detached worktree at the current stack (stock + kept commits)
    trees/candidate    detached worktree at the stack with one candidate applied
    trees/rollback     the rollback drill: the stack with the kept commits reverted
    incoming/          the candidate patch files (outside every tree)

The user's checkout is touched exactly once per keep, and only in its git
metadata: the session branch ``inferloom/<session id>`` is fetched into it
(``git fetch`` into a branch that is not checked out, no hooks run). Its
working tree, index, HEAD and current branch are never changed.

Commits are deterministic (fixed identity and dates derived from the session),
so re-applying the kept patches from the ledger after a crash rebuilds the
same commit ids: state.json + ledger are enough to reconstruct everything.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from inferloom.patches.parse import PatchRefusal
from inferloom.workloads.custom import git

__all__ = ["Workspace", "DOES_NOT_APPLY"]

DOES_NOT_APPLY = "does_not_apply"


class Workspace:
    def __init__(self, root: str | Path, user_repo: str | Path, *, date: int = 0) -> None:
        # absolute: git runs with cwd= the clone or a tree, where a relative path would name another place
        self.root = Path(root).absolute()
        self.user_repo = Path(user_repo).absolute() if str(user_repo) else Path(user_repo)
        self.repo = self.root / "repo.git"
        self.date = int(date)

    def _env(self) -> dict[str, str]:
        stamp = f"{self.date} +0000"
        return {"GIT_AUTHOR_NAME": "inferloom", "GIT_AUTHOR_EMAIL": "inferloom@localhost",
                "GIT_COMMITTER_NAME": "inferloom", "GIT_COMMITTER_EMAIL": "inferloom@localhost",
                "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}

    def clear_stale_locks(self) -> list[str]:
        """Lock files a killed git left in the clone (one writer per session: any lock is stale)."""
        gone = []
        if self.repo.is_dir():
            for lock in self.repo.rglob("*.lock"):
                lock.unlink(missing_ok=True)
                gone.append(str(lock.relative_to(self.repo)))
        return gone

    def ensure_clone(self) -> None:
        if (self.repo / "HEAD").is_file():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / "repo.git.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        git("clone", "--bare", "--quiet", str(self.user_repo), str(tmp))
        os.replace(tmp, self.repo)

    def fetch_from_user(self, sha: str) -> None:
        """Make sure ``sha`` (a commit of the user's repo) is in the clone."""
        if not self.has_commit(sha):
            git("fetch", "--quiet", str(self.user_repo), "+refs/heads/*:refs/heads/*", cwd=self.repo)

    def has_commit(self, sha: str) -> bool:
        return git("cat-file", "-e", f"{sha}^{{commit}}", cwd=self.repo, check=False).returncode == 0

    def tree(self, name: str, sha: str) -> Path:
        """Worktree ``trees/NAME`` at ``sha``, clean (created or reset)."""
        self.ensure_clone()
        path = self.root / "trees" / name
        if (path / ".git").is_file():
            ok = git("checkout", "--quiet", "--force", "--detach", sha, cwd=path, check=False).returncode == 0
            if ok and git("clean", "-fdxq", cwd=path, check=False).returncode == 0:
                return path
        # absent, or left half-made by a killed run: make it afresh
        shutil.rmtree(path, ignore_errors=True)
        git("worktree", "prune", cwd=self.repo)
        path.parent.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--quiet", "--force", "--detach", str(path), sha, cwd=self.repo)
        return path

    def remove(self, name: str) -> None:
        path = self.root / "trees" / name
        if path.exists():
            git("worktree", "remove", "--force", str(path), cwd=self.repo, check=False)
            shutil.rmtree(path, ignore_errors=True)
        if self.repo.exists():
            git("worktree", "prune", cwd=self.repo, check=False)

    def apply(self, name: str, base_sha: str, patch_id: str, text: str) -> Path:
        """Tree ``NAME`` at ``base_sha`` with the patch applied (uncommitted);
        PatchRefusal ``does_not_apply`` when git cannot apply it cleanly."""
        path = self.tree(name, base_sha)
        incoming = self.root / "incoming"
        incoming.mkdir(parents=True, exist_ok=True)
        pfile = incoming / f"{patch_id}.patch"
        pfile.write_text(text)
        res = git("apply", "--check", "--index", "--whitespace=nowarn", str(pfile), cwd=path, check=False)
        if res.returncode != 0:
            raise PatchRefusal(DOES_NOT_APPLY, "git apply --check refused it on the current stack: "
                                               + (res.stderr.strip().splitlines() or ["?"])[0][:300])
        # --index: only the patch is staged, never what a run writes into the tree
        git("apply", "--index", "--whitespace=nowarn", str(pfile), cwd=path)
        return path

    def commit(self, name: str, message: str) -> str:
        path = self.root / "trees" / name
        git("commit", "--quiet", "--no-verify", "-m", message, cwd=path, env=self._env())
        return self.head(name)

    def head(self, name: str) -> str:
        return git("rev-parse", "HEAD", cwd=self.root / "trees" / name).stdout.strip()

    def tree_id(self, sha: str) -> str:
        return git("rev-parse", f"{sha}^{{tree}}", cwd=self.repo).stdout.strip()

    def publish(self, branch: str, sha: str) -> None:
        """Point ``branch`` at ``sha`` in the clone, then in the user's checkout (git metadata only)."""
        git("update-ref", f"refs/heads/{branch}", sha, cwd=self.repo)
        # this session is the only writer of its branch: a lock on it was left by a killed fetch
        common = git("rev-parse", "--git-common-dir", cwd=self.user_repo).stdout.strip()
        git_dir = (self.user_repo / common).resolve()  # refs live in the common dir (also for a worktree)
        (git_dir / "refs" / "heads" / f"{branch}.lock").unlink(missing_ok=True)
        git("fetch", "--quiet", "--no-tags", "--no-write-fetch-head", str(self.repo),
            f"+refs/heads/{branch}:refs/heads/{branch}", cwd=self.user_repo)

    def revert(self, name: str, stack_sha: str, shas: list[str]) -> str:
        """Tree ``NAME``: ``stack_sha`` with ``shas`` reverted, newest first; returns its commit."""
        path = self.tree(name, stack_sha)
        for sha in reversed(shas):
            git("revert", "--no-edit", sha, cwd=path, env=self._env())
        return self.head(name)

    def format_patches(self, base: str, head: str, out: Path) -> list[Path]:
        out = Path(out).absolute()
        out.mkdir(parents=True, exist_ok=True)
        res = git("format-patch", "-o", str(out), f"{base}..{head}", cwd=self.repo,
                  env=self._env())
        return sorted(Path(p) for p in res.stdout.split() if p) or sorted(out.glob("*.patch"))

    def describe(self) -> dict[str, Any]:
        return {"root": str(self.root), "clone": str(self.repo), "user_repo": str(self.user_repo)}
