"""What a result was made with: package versions and the git commit (cells' provenance files and
the report's provenance page both record them)."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Iterable
from importlib import metadata


def package_versions(names: Iterable[str]) -> dict[str, str]:
    """Python's version and each installed distribution's (``not installed`` where absent)."""
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def git_commit(cwd: str | os.PathLike | None = None) -> str:
    """HEAD's SHA (``-dirty`` when tracked files changed), or ``unknown`` outside a git checkout."""
    try:
        def git(*args):
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                                  check=True, cwd=cwd).stdout.strip()

        sha = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
