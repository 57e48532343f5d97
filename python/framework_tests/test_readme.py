"""The README's PyTorch, PyG and JAX snippets, run as written in fresh interpreters: each is the
```python block after a `<!-- readme-test: NAME -->` marker, and its printed output must equal
its `# expected output:` lines (as python/tests/test_readme.py does for ctypes and cffi)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def snippets() -> dict:
    text = (REPO / "README.md").read_text()
    return dict(re.findall(r"<!-- readme-test: (\w+) -->\s*```python\n(.*?)```", text, re.S))


@pytest.mark.parametrize("name", ["torch", "pyg", "jax"])
def test_snippet_runs_as_written(name, tmp_path):
    if name == "jax" and not os.environ.get("STRATA_JAX_LIBRARY"):
        pytest.skip("STRATA_JAX_LIBRARY is not set (scripts/framework-tests.sh builds it)")
    code = snippets()[name]
    want = [line.split("# expected output:", 1)[1].strip() for line in code.splitlines() if "# expected output:" in line]
    assert want, f"the {name} snippet states its expected output"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert " ".join(r.stdout.split()) == " ".join(want), r.stdout
