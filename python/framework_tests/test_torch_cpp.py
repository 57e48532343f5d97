"""libstrata_torch.so, the C++ op library (c_examples/torch/strata_torch.cc): loaded with
``torch.ops.load_library`` in a fresh process (the Python ops of strata.torch define the same
names, so the two never share a process), a TorchScript model calling it scripted, saved, loaded
back and run, against ``index_select`` / ``embedding_bag``; opcheck and torch.compile over its
Meta kernels; an AOTInductor package built from torch.export and run in another process; errors
and freed handles. ``STRATA_TORCH_OP`` names the library
(scripts/framework-tests.sh builds it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

LIB = os.environ.get("STRATA_TORCH_OP")
pytestmark = pytest.mark.skipif(not LIB, reason="STRATA_TORCH_OP is not set (scripts/framework-tests.sh builds it)")

PRELUDE = """
import warnings
warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit.script is deprecated in 2.14
import numpy as np, torch, torch.nn.functional as F
from typing import List, Optional
torch.ops.load_library(LIB)
rng = np.random.default_rng(20261224)
"""


def run(body: str, tmp_path) -> str:
    """Runs ``body`` in a fresh Python process that has loaded the library."""
    code = f"LIB = {LIB!r}\nTMP = {str(tmp_path)!r}\n" + PRELUDE + textwrap.dedent(body)
    script = tmp_path / "script.py"  # TorchScript reads the model's source from its file
    script.write_text(code)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_scripted_model_saved_and_loaded(tmp_path):
    out = run("""
    vec = torch.from_numpy(rng.standard_normal((300, 16)).astype(np.float32))
    keys = rng.choice(10**9, size=300, replace=False)
    t = torch.ops.strata.table_from_tensors(vec, torch.from_numpy(keys), -1.5, False)
    dense = torch.ops.strata.table_from_tensors(vec[:, :8].contiguous())
    assert torch.ops.strata.table_dim(t) == 16

    class Model(torch.nn.Module):
        def __init__(self, t: int, dense: int):
            super().__init__()
            self.t = t
            self.dense = dense

        def forward(self, ids: torch.Tensor, bags: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
            rows = torch.ops.strata.lookup(self.t, ids)
            pooled = torch.ops.strata.lookup_pooled(self.dense, bags, offsets, None, "mean")
            no_weights: List[Optional[torch.Tensor]] = [None, None]
            both = torch.ops.strata.lookup_batch([self.dense, self.t], [bags, ids], [offsets, None],
                                                 no_weights, ["sum", "none"])
            return torch.cat([rows.sum(1), pooled, both[0], both[1].sum(1)], 1)

    scripted = torch.jit.script(Model(t, dense))
    assert "strata::lookup" in scripted.graph.str() or "strata.lookup" in str(scripted.code)
    scripted.save(TMP + "/model.pt")
    loaded = torch.jit.load(TMP + "/model.pt")
    index = {int(k): i for i, k in enumerate(keys)}
    for trial in range(3):
        q = np.concatenate([rng.choice(keys, size=(20,)), [10**9 + 5]]).reshape(7, 3)
        ids = torch.from_numpy(q)
        lens = rng.integers(0, 5, size=7)
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lens)]))
        bags = torch.from_numpy(rng.integers(0, 300, size=int(offsets[-1])))
        rows = torch.stack([vec[index[int(k)]] if int(k) in index else torch.full((16,), -1.5)
                            for k in q.reshape(-1)]).reshape(7, 3, 16)
        want = torch.cat([rows.sum(1),
                          F.embedding_bag(bags, vec[:, :8], offsets, mode="mean", include_last_offset=True),
                          F.embedding_bag(bags, vec[:, :8], offsets, mode="sum", include_last_offset=True),
                          rows.sum(1)], 1)
        for m in (scripted, loaded):
            torch.testing.assert_close(m(ids, bags, offsets), want, rtol=1e-5, atol=1e-5)
    plain = torch.ops.strata.lookup(t, torch.from_numpy(keys[:5]))
    assert torch.equal(plain, vec[:5])
    assert torch.ops.strata.lookup(dense, torch.tensor([4, 2]), torch.bfloat16).dtype == torch.bfloat16
    print("ok")
    """, tmp_path)
    assert out.strip().endswith("ok")


def test_opcheck_and_compile_on_meta_kernels(tmp_path):
    out = run("""
    from torch.library import opcheck
    import torch._dynamo
    vec = torch.from_numpy(rng.standard_normal((64, 8)).astype(np.float32))
    h = torch.ops.strata.table_from_tensors(vec)
    keys = torch.from_numpy(rng.integers(0, 64, size=(4, 5)))
    offsets = torch.tensor([0, 3, 3, 9, 20])
    for op, args in [(torch.ops.strata.lookup.default, (h, keys, None)),
                     (torch.ops.strata.lookup_pooled.default, (h, keys.reshape(-1), offsets, torch.rand(20), "sqrtn", None)),
                     (torch.ops.strata.lookup_batch.default, ([h, h], [keys, keys.reshape(-1)], [None, offsets],
                                                               [None, None], ["none", "sum"], None))]:
        r = opcheck(op, args)
        assert set(r.values()) == {"SUCCESS"}, r
    f = lambda k, o: torch.ops.strata.lookup(h, k).sum(1) + torch.ops.strata.lookup_pooled(h, k.reshape(-1), o, None, "sum")[:k.shape[0]]
    e = torch._dynamo.explain(f)(keys, offsets)
    assert e.graph_break_count == 0, e.break_reasons
    got = torch.compile(f, fullgraph=True)(keys, offsets)
    torch.testing.assert_close(got, f(keys, offsets), rtol=1e-5, atol=1e-5)  # inductor sums in its own order
    print("ok")
    """, tmp_path)
    assert out.strip().endswith("ok")


def test_errors_and_freed_tables(tmp_path):
    out = run("""
    import pytest
    h = torch.ops.strata.table_from_tensors(torch.ones(4, 2))
    with pytest.raises(TypeError, match="keys: dtype float32"):
        torch.ops.strata.lookup(h, torch.ones(3))
    with pytest.raises(ValueError, match="offsets"):
        torch.ops.strata.lookup_pooled(h, torch.tensor([1, 2]), torch.tensor([1, 2]), None, "sum")
    with pytest.raises(ValueError, match="pooling"):
        torch.ops.strata.lookup_pooled(h, torch.tensor([[1]]), None, None, "max")
    with pytest.raises(TypeError, match="vectors"):
        torch.ops.strata.table_from_tensors(torch.ones(4, 2, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="table_open"):
        torch.ops.strata.table_open(TMP + "/absent", 4)
    assert torch.ops.strata.lookup_batch([], [], [], [], []) == []
    with pytest.raises(ValueError, match="expected one per table"):
        torch.ops.strata.lookup_batch([h, h], [torch.tensor([1])], [None], [None], ["none"])
    strict = torch.ops.strata.table_from_tensors(torch.ones(3, 2), torch.tensor([5, 6, 7]), 0.0, True)
    with pytest.raises(IndexError, match="8"):
        torch.ops.strata.lookup(strict, torch.tensor([5, 8]))

    compiled = torch.compile(lambda k: torch.ops.strata.lookup(h, k) * 2, fullgraph=True)
    assert torch.equal(compiled(torch.tensor([1, 3])), torch.full((2, 2), 2.0))
    torch.ops.strata.table_free(h)
    with pytest.raises(ValueError, match=f"handle {h} names no table"):
        compiled(torch.tensor([1, 3]))
    with pytest.raises(ValueError, match="names no table"):
        torch.ops.strata.table_free(h)
    with pytest.raises(ImportError, match="already defined in this process"):
        import strata.torch
    print("ok")
    """, tmp_path)
    assert out.strip().endswith("ok")


def test_aotinductor_package_runs_in_a_fresh_process(tmp_path):
    """torch.export of a model calling the C++ ops (a dynamic batch), compiled by AOTInductor into
    a .pt2 package, then loaded and run in another process that made its table first (handles
    count from 1 in each process, so the baked-in handle names that process's first table)."""
    run("""
    vec = torch.from_numpy(rng.standard_normal((100, 8)).astype(np.float32))
    np.save(TMP + "/vec.npy", vec.numpy())
    h = torch.ops.strata.table_from_tensors(vec)
    assert h == 1

    class M(torch.nn.Module):
        def forward(self, k: torch.Tensor, bags: torch.Tensor) -> torch.Tensor:
            return torch.ops.strata.lookup(h, k).sum(1) + torch.ops.strata.lookup_pooled(h, bags, None, None, "mean")

    k, bags = torch.randint(0, 100, (5, 3)), torch.randint(0, 100, (5, 4))
    b = torch.export.Dim("b")
    ep = torch.export.export(M(), (k, bags), dynamic_shapes={"k": {0: b}, "bags": {0: b}})
    assert "strata.lookup" in ep.graph_module.code
    torch._inductor.aoti_compile_and_package(ep, package_path=TMP + "/model.pt2")
    print("ok")
    """, tmp_path)
    out = run("""
    vec = torch.from_numpy(np.load(TMP + "/vec.npy"))
    assert torch.ops.strata.table_from_tensors(vec) == 1
    m = torch._inductor.aoti_load_package(TMP + "/model.pt2")
    for n in (7, 2):
        k, bags = torch.randint(0, 100, (n, 3)), torch.randint(0, 100, (n, 4))
        torch.testing.assert_close(m(k, bags), vec[k].sum(1) + vec[bags].mean(1), rtol=1e-5, atol=1e-5)
    print("ok")
    """, tmp_path)
    assert out.strip().endswith("ok")
