"""The framework integrations as the installed wheel ships them (the full suites are
python/framework_tests, run by scripts/framework-tests.sh): strata.torch's ops on this venv's
PyTorch (2.10 here, 2.14 there), and strata.jax compiling its handlers from the source the wheel
carries (strata/native) against this venv's jaxlib."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest


def test_torch_ops_on_this_torch():
    torch = pytest.importorskip("torch", reason="skipped: PyTorch is not installed")
    import strata
    import strata.torch as st

    rng = np.random.default_rng(5)
    vec = torch.from_numpy(rng.standard_normal((50, 8)).astype(np.float32))
    keys = torch.from_numpy(rng.integers(0, 50, size=(4, 6)))
    with strata.Table.from_array(vec) as t:
        assert torch.equal(torch.ops.strata.lookup(st.handle(t), keys), vec[keys])
        f = torch.compile(lambda k: st.lookup_pooled(t, k, pooling="sum"), fullgraph=True)
        torch.testing.assert_close(f(keys), torch.nn.functional.embedding_bag(keys, vec, mode="sum"))
        result = torch.library.opcheck(torch.ops.strata.lookup.default, (st.handle(t), keys, None))
        assert set(result.values()) == {"SUCCESS"}, result


def test_jax_handlers_build_from_the_wheel(tmp_path):
    if os.environ.get("STRATA_SKIP_JAX"):
        pytest.skip("skipped: STRATA_SKIP_JAX is set")
    pytest.importorskip("jax", reason="skipped: JAX is not installed")
    import strata

    native = os.path.join(os.path.dirname(strata.__file__), "native")
    if not os.path.exists(os.path.join(native, "strata_jax.cc")):
        pytest.skip("skipped: strata is used from the source tree (no strata/native)")
    code = ("import numpy as np, jax, jax.numpy as jnp, strata, strata.jax as sj\n"
            "t = strata.Table.from_array(np.arange(6, dtype=np.float32).reshape(3, 2))\n"
            "print(jax.jit(lambda k: sj.lookup(t, k))(jnp.array([2, 0])).tolist())")
    env = {k: v for k, v in os.environ.items() if k != "STRATA_JAX_LIBRARY"}
    env["STRATA_JAX_BUILD_DIR"] = str(tmp_path)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[[4.0, 5.0], [0.0, 1.0]]"
    assert (tmp_path / "libstrata_jax.so").exists()
