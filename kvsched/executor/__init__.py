"""The executor: replay a schedule on a real PyTorch transformer and measure every batch.

Modules, one job each:

* :mod:`~kvsched.executor.device`  -- torch as an optional dependency, devices, dtypes, timers;
* :mod:`~kvsched.executor.model`   -- a Llama-style decoder with seeded random weights;
* :mod:`~kvsched.executor.kvcache` -- the paged KV pool of exactly M token slots;
* :mod:`~kvsched.executor.batch`   -- one batch's tensor work (paged attention, one forward);
* :mod:`~kvsched.executor.runner`  -- replay a schedule, stepping the semantic core alongside;
* :mod:`~kvsched.executor.oracle`  -- tokens of each request run alone, and the comparison;
* :mod:`~kvsched.executor.measure` -- measured vs predicted, end-to-end metrics, fits (no torch);
* :mod:`~kvsched.executor.profile` -- microbenchmarks in Vidur's table columns.

Only :mod:`~kvsched.executor.measure` imports without torch; ``pip install -e .[gpu]``
(or ``pip install torch==2.13.0`` for the CPU build) provides it.
"""
