"""CI and the commit hooks check the same things: `.ci/run` runs `make check` (ruff, ruff format
--check, mypy) before the README's test command, and `.pre-commit-config.yaml` runs exactly the
Makefile's `lint` and `typecheck` commands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _recipe(target: str) -> list[str]:
    """The commands of a Makefile target, ``$(BIN)/`` written as ``.venv/bin/``."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"^{target}:", line))
    body = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        body.append(line.strip().replace("$(BIN)/", ".venv/bin/"))
    return body


def test_ci_runs_the_static_checks_before_the_readme_test_command() -> None:
    commands = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip().startswith("make ")
    ]
    assert [c.split()[1] for c in commands] == ["check", "test"], commands
    check = next(
        line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("check:")
    )
    assert check.split("##")[0].split()[1:] == ["lint", "typecheck"], check
    readme = (ROOT / "README.md").read_text()
    assert "make test " in readme  # the README's test command is the one CI runs


def test_the_commit_hooks_are_the_makefiles_lint_and_typecheck() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [h for repo in config["repos"] for h in repo["hooks"]]
    assert [h["entry"] for h in hooks] == _recipe("lint") + _recipe("typecheck")
    assert all(h["language"] == "system" and h["pass_filenames"] is False for h in hooks)
    done = subprocess.run(
        [sys.executable, "-m", "pre_commit", "validate-config", ".pre-commit-config.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
