"""strata.legate: the lookup task on 1 and 2 Legate CPU processors against NumPy, errors, and the
process's thread count after tasks pinned to cores ran strata. Each case runs in a fresh process
(Legate's configuration is per process) with LEGATE_CONFIG="--cpus N --gpus 0"; without an
NVIDIA driver the processes get a stand-in libcuda.so.1 (fake_libcuda.c, built here with cc)
whose cuInit says "no device"."""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

HERE = pathlib.Path(__file__).resolve().parent
# (found, not imported: Legate's libraries need libcuda.so.1, which the fixture provides)
for _mod in ("legate", "cupynumeric"):
    if importlib.util.find_spec(_mod) is None:
        pytest.skip(f"{_mod} is not installed (pip install 'strata[legate]')", allow_module_level=True)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = dict(os.environ, LEGATE_AUTO_CONFIG="0")
    paths = []
    spec = importlib.util.find_spec("nvidia")  # the CUDA runtime wheel's libcudart, which Legate links
    for base in (spec.submodule_search_locations or []) if spec else []:
        for lib in pathlib.Path(base).glob("cu*/lib"):
            paths.append(str(lib))
    if ctypes.util.find_library("cuda") is None:
        out = tmp_path_factory.mktemp("fake-cuda")
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", str(HERE / "fake_libcuda.c"),
                        "-o", str(out / "libcuda.so.1"), "-Wl,-soname,libcuda.so.1"], check=True)
        paths.insert(0, str(out))
    e["LD_LIBRARY_PATH"] = ":".join(paths + [e.get("LD_LIBRARY_PATH", "")])
    return e


def run(env, cpus, body):
    code = textwrap.dedent("""
        import os, numpy as np, cupynumeric as cn, strata, strata.legate as sl
        from legate.core import get_legate_runtime
        rng = np.random.default_rng(20261224)
    """) + textwrap.dedent(body)
    e = dict(env, LEGATE_CONFIG=f"--cpus {cpus} --gpus 0")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return r.stdout


@pytest.mark.parametrize("cpus", [1, 2])
def test_lookup_task_matches_numpy(env, cpus):
    out = run(env, cpus, f"""
        m = get_legate_runtime().machine
        print("cpus", m.count(m.preferred_target))
        keys = rng.choice(10**9, size=4000, replace=False)
        vec = rng.standard_normal((4000, 24)).astype(np.float32)
        t = strata.Table.from_array(vec, keys, default_value=-0.5)
        index = {{int(k): i for i, k in enumerate(keys)}}
        for n in (1, 999, 20000):
            q = rng.choice(keys, n)
            q[0] = 10**9 + 3  # a miss
            want = np.stack([vec[index[int(k)]] if int(k) in index else np.full(24, -0.5, np.float32) for k in q])
            got = sl.lookup(t, cn.array(q))
            assert isinstance(got, cn.ndarray) and got.shape == (n, 24)
            assert np.array_equal(np.asarray(got), want)
            # into a poisoned output of the caller's
            out = cn.full((n, 24), np.nan, dtype=cn.float32)
            assert sl.lookup_into(t, cn.array(q.astype(np.int32) if q.max() < 2**31 else q), out) is out
            assert np.array_equal(np.asarray(out), want)
        dense = strata.Table.from_array(vec)
        k32 = cn.array(rng.integers(0, 4000, 5000).astype(np.uint32))
        assert np.array_equal(np.asarray(sl.lookup(dense, k32)), vec[np.asarray(k32)])
        print("ok")
    """)
    assert f"cpus {cpus}" in out and out.strip().endswith("ok")


def test_errors(env):
    out = run(env, 2, """
        import pytest
        vec = np.ones((10, 4), np.float32)
        strict = strata.Table.from_array(vec, np.arange(10) * 7, missing="error")
        with pytest.raises(strata.KeyNotFound, match="key 5"):
            sl.lookup(strict, cn.array(np.array([0, 7, 5])))
        t = strata.Table.from_array(vec)
        with pytest.raises(strata.InvalidArgument, match="out: shape"):
            sl.lookup_into(t, cn.array(np.arange(3)), cn.zeros((3, 5), dtype=cn.float32))
        with pytest.raises(strata.InvalidArgument, match="keys: 2 dimensions"):
            sl.lookup(t, cn.zeros((2, 2), dtype=cn.int64))
        with pytest.raises(strata.UnsupportedDtype, match="keys: dtype float"):
            sl.lookup(t, cn.zeros(3, dtype=cn.float32))
        t.close()
        with pytest.raises(strata.NullArgument, match="closed"):
            sl.lookup(t, cn.array(np.arange(3)))
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_tasks_pinned_to_cores_keep_the_process_thread_count(env):
    """A --cpus 1 task thread is pinned to one CPU. A user's task calling strata.lookup with the
    default threads must not shrink strata's default thread count for the whole process (the
    core's per-thread affinity rule: num_threads = 0 is the calling thread's own mask)."""
    out = run(env, 1, """
        from legate.core import VariantCode, align, broadcast
        from legate.core.task import task, InputStore, OutputStore

        @task(variants=(VariantCode.CPU,), constraints=(align("keys", "out"), broadcast("out", (1,))))
        def user_task(keys: InputStore, out: OutputStore) -> None:
            print("task affinity", len(os.sched_getaffinity(0)), flush=True)
            strata.lookup(t, np.asarray(keys)[:, 0], np.asarray(out))  # default threads

        from legate.core import as_logical_array
        t = strata.Table.from_array(np.ones((10, 4), np.float32))
        keys, out = cn.array(np.arange(5)), cn.zeros((5, 4), dtype=cn.float32)
        user_task(as_logical_array(keys).data.promote(1, 4), as_logical_array(out).data)
        get_legate_runtime().issue_execution_fence(block=True)
        assert np.array_equal(np.asarray(out), np.ones((5, 4), np.float32))
        print("threads", strata.default_num_threads(), len(os.sched_getaffinity(0)))
    """)
    assert "task affinity 1" in out, out
    line = next(ln for ln in out.splitlines() if ln.startswith("threads"))
    _, got, cpus = line.split()
    assert int(got) == int(cpus), line


def test_import_error_names_the_extra():
    code = "import sys; sys.modules['legate'] = None\ntry:\n import strata.legate\nexcept ImportError as e: print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'strata[legate]'" in out
