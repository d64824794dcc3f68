"""Test-wide settings."""

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
    """
    from kvsched.commands.warmup import FAMILIES

    for _, run in FAMILIES.values():
        run()
