"""torch as an optional dependency: importing it, devices, dtypes and timing.

Nothing else in kvsched imports torch at module level through this package's
commands: they call :func:`require_torch` first, so that a missing torch is one
line that says how to install it, never a traceback.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from kvsched.errors import InputError, KvschedError

if TYPE_CHECKING:
    import torch

INSTALL_HINT = (
    "PyTorch is not installed: pip install -e .[gpu] (or pip install torch==2.13.0 for the CPU build)"
)
#: dtypes the executor builds models in, by their torch names.
DTYPES = ("float32", "float64", "bfloat16", "float16")
T = TypeVar("T")


def require_torch() -> ModuleType:
    """The ``torch`` module, or a :class:`KvschedError` saying how to install it."""
    try:
        import torch
    except ImportError:
        raise KvschedError(INSTALL_HINT) from None
    return torch


def resolve_device(name: str) -> torch.device:
    """``cpu`` or ``cuda`` (``cuda:N``), checked against what torch can see."""
    torch = require_torch()
    if not (name == "cpu" or name == "cuda" or name.startswith("cuda:")):
        raise InputError(f"--device: expected cpu or cuda, got {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        build = torch.version.cuda or "CPU-only"
        raise KvschedError(
            f"--device {name}: no CUDA device visible to torch {torch.__version__} ({build} build)"
        )
    return torch.device(name)


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """The dtype called ``name``; by default float32 on CPU and bfloat16 on CUDA."""
    torch = require_torch()
    if name is None:
        name = "float32" if device.type == "cpu" else "bfloat16"
    if name not in DTYPES:
        raise InputError(f"--dtype: expected one of {', '.join(DTYPES)}, got {name!r}")
    return getattr(torch, name)


def free_memory(device: torch.device) -> int | None:
    """Bytes that ``device`` can still hand out: free GPU memory on CUDA, the kernel's MemAvailable on CPU
    (``None`` where it cannot be read, e.g. off Linux)."""
    if device.type == "cuda":
        return int(require_torch().cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits(needed: int, device: torch.device, what: str, hint: str) -> None:
    """One :class:`InputError` when ``needed`` bytes exceed what the CPU has free (``device`` a CPU).

    On CPU the allocation itself would not fail: the pages are touched as they are filled, and the kernel's
    out-of-memory killer ends the process (or another one) without a word. On CUDA the allocator's own
    error is the answer (its cache holds memory that :func:`free_memory` counts as taken).
    """
    if device.type != "cpu":
        return
    free = free_memory(device)
    if free is not None and needed > free:
        raise InputError(
            f"{what} needs {needed / 1e9:,.1f} GB, more than the {free / 1e9:,.1f} GB free on {device}; "
            f"{hint}"
        )


@contextmanager
def allocating(needed: int, device: torch.device, what: str, hint: str) -> Iterator[None]:
    """Check that ``needed`` bytes fit (:func:`check_fits`), then turn an allocation failure inside the block
    into one :class:`InputError` naming ``what`` (torch's CPU allocator error was exit 3, internal error)."""
    check_fits(needed, device, what, hint)
    try:
        yield
    except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        if not isinstance(exc, MemoryError) and "alloc" not in str(exc).lower():
            raise
        raise InputError(f"{what}: {needed / 1e9:,.1f} GB cannot be allocated on {device}; {hint}") from None


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        require_torch().cuda.synchronize(device)


class Timer:
    """Seconds that one call takes on ``device``.

    On CPU, wall-clock time (``time.perf_counter``). On CUDA, the time between
    two CUDA events recorded around the call after the queue has drained, so
    that it counts the device work the call enqueues, not work queued before.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._torch = require_torch()
        #: The durations of the last :meth:`median` call, sorted.
        self.times: list[float] = []

    def time(self, fn: Callable[[], T]) -> tuple[T, float]:
        """Run ``fn`` once; return its result and its duration in seconds."""
        if self.device.type != "cuda":
            start = time.perf_counter()
            out = fn()
            return out, time.perf_counter() - start
        cuda = self._torch.cuda
        cuda.synchronize(self.device)
        begin = cuda.Event(enable_timing=True)
        end = cuda.Event(enable_timing=True)
        begin.record()
        out = fn()
        end.record()
        end.synchronize()
        return out, begin.elapsed_time(end) / 1e3

    def median(self, fn: Callable[[], T], repeat: int) -> tuple[T, float]:
        """Run ``fn`` ``repeat`` times; its last result and the median duration."""
        times = []
        out: Any = None
        for _ in range(max(1, repeat)):
            out, secs = self.time(fn)
            times.append(secs)
        times.sort()
        self.times = times
        mid = len(times) // 2
        median = times[mid] if len(times) % 2 else 0.5 * (times[mid - 1] + times[mid])
        return out, median

    def spread(self) -> float:
        """(max - min) / median of the last :meth:`median` call's durations; NaN for a single run."""
        t = self.times
        if len(t) < 2:
            return float("nan")
        mid = len(t) // 2
        median = t[mid] if len(t) % 2 else 0.5 * (t[mid - 1] + t[mid])
        return (t[-1] - t[0]) / median if median > 0 else float("nan")


def environment(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """What a measurement ran on: device name, torch/CUDA versions, attention backends."""
    torch = require_torch()
    env: dict[str, Any] = {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["device_name"] = props.name
        env["device_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["cudnn"] = torch.backends.cudnn.version()
        env["sdpa_backends"] = {
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
        }
    else:
        env["device_name"] = platform.processor() or platform.machine()
    return env


def capture_graph(fn: Callable[[], Any], pool: Any = None) -> Any:
    """A CUDA graph of ``fn`` (in ``pool`` when given), after one warm-up call on a side stream.

    The warm-up compiles, autotunes and allocates outside the capture, where none of it may happen.
    Raises what torch raises when ``fn`` cannot be captured (e.g. it reads a device value on the host).
    """
    cuda = require_torch().cuda
    side = cuda.Stream()
    side.wait_stream(cuda.current_stream())
    with cuda.stream(side):
        fn()
    cuda.current_stream().wait_stream(side)
    graph = cuda.CUDAGraph()
    with cuda.graph(graph, pool=pool):
        fn()
    return graph
