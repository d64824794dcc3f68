"""Test-wide settings."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the ShareGPT length cache out of the user's home directory."""
    mp = pytest.MonkeyPatch()
    mp.setenv("KVSCHED_CACHE_DIR", str(tmp_path_factory.mktemp("kvsched-cache")))
    yield
    mp.undo()
