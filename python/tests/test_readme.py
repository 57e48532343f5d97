"""The README's ctypes and cffi snippets, run exactly as written.

Each snippet is the fenced ```python block right after a `<!-- readme-test: NAME -->` marker in
README.md; it runs in a fresh interpreter with $STRATA_LIBRARY pointing at the built library,
and its printed output must equal the `# expected output:` lines of the same block.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
from test_ctypes import LIB_PATH

REPO = pathlib.Path(__file__).resolve().parents[2]


def snippets() -> dict:
    text = (REPO / "README.md").read_text()
    found = dict(re.findall(r"<!-- readme-test: (\w+) -->\s*```python\n(.*?)```", text, re.S))
    return found


def test_the_readme_has_both_snippets():
    assert set(snippets()) >= {"ctypes", "cffi"}


@pytest.mark.parametrize("name", ["ctypes", "cffi"])
def test_snippet_runs_as_written(name, tmp_path):
    if name == "cffi":
        pytest.importorskip("cffi", reason="skipped: cffi not installed (pip install cffi)")
    code = snippets()[name]
    want = [line.split("# expected output:", 1)[1].strip() for line in code.splitlines() if "# expected output:" in line]
    assert want, f"the {name} snippet states its expected output"
    env = dict(os.environ, STRATA_LIBRARY=os.environ.get("STRATA_LIBRARY", LIB_PATH))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    got = " ".join(r.stdout.split())
    assert got == " ".join(want), r.stdout
