"""Test-wide settings."""

import os

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

    Odd-numbered workers compile the families in reverse order. A kernel another process has already cached is
    loaded rather than compiled again (numba looks in its cache before compiling), so two workers starting
    from an empty cache share the compiling instead of both doing all of it: on this 2-core machine the two
    workers' warmups took 286-288 s each against 410-412 s when both went in the same order (load 7).
    """
    from kvsched.commands.warmup import FAMILIES

    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    runs = [run for _, run in FAMILIES.values()]
    if worker.startswith("gw") and int(worker[2:] or 0) % 2:
        runs.reverse()
    for run in runs:
        run()
