"""kvsched: provably optimal LLM-inference schedules, and every scheduler measured against them."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvsched")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
