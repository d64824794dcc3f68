"""Test-wide settings."""

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the ShareGPT length cache out of the user's home directory."""
    mp = pytest.MonkeyPatch()
    mp.setenv("KVSCHED_CACHE_DIR", str(tmp_path_factory.mktemp("kvsched-cache")))
    yield
    mp.undo()


@pytest.fixture(autouse=True, scope="session")
def _compiled_kernels() -> None:
    """Every numba kernel family compiled before the first test, as ``kvsched warmup`` does after an install.

    A time-limited solve runs the interpreted path or skips a stage where a kernel is cold and its compile
    does not fit the limit (:mod:`kvsched.jit`); CI starts from an empty numba cache, and which test meets a
    cold kernel first depends on the order and on the worker (pytest-xdist), so without this a pipeline test
    could lose its Lagrangian stage to a compile. The tests of the cold paths make kernels look cold themselves.

    The two workers split the compiling: numba looks in its cache before compiling, so a kernel the other
    worker has already cached is loaded, not compiled again. The chain family alone takes about as long as the
    other three together, so even-numbered workers start with it and odd ones end with it. From an empty cache
    (two processes at once, fresh exports, quiet 2-core machine): 76 / 89 s per worker, against 105 / 103 s with
    the two in opposite orders of ``FAMILIES`` and 161 s each when both went in the same order.
    """
    from kvsched.commands.warmup import FAMILIES

    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    odd = worker.startswith("gw") and int(worker[2:] or 0) % 2 == 1
    names = [name for name in FAMILIES if name != "chain-lagrangian"]
    names = [*names, "chain-lagrangian"] if odd else ["chain-lagrangian", *names]
    for name in names:
        FAMILIES[name][1]()


@pytest.fixture(scope="module")
def torch():
    """torch on one thread (skipped without it): the executor tests' tiny model's matmuls are microseconds,
    and more threads only add contention."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_instance_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real sweep of one instance (the solver and two policies): copy it before any write."""
    from kvsched.analysis.spec import parse_spec
    from kvsched.analysis.sweep import run_sweep
    from tests.test_sweep import tiny

    folder = tmp_path_factory.mktemp("one-instance")
    data = tiny()
    data["instances"][0]["seeds"] = 1
    run_sweep(parse_spec(data), folder / "r.sqlite", workers=1, progress=False)
    return folder / "r.sqlite"


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch):
    """``spy(module, name)``: the keyword arguments of every call of ``module.name``, which still runs."""

    def install(module: object, name: str) -> list[dict]:
        calls: list[dict] = []
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls.append(kwargs)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)
        return calls

    return install
