"""The executor: replay a schedule on a real PyTorch transformer and measure every batch.

Modules, one job each:

* :mod:`~kvsched.executor.device`  -- torch as an optional dependency, devices, dtypes, timers;
* :mod:`~kvsched.executor.model`   -- a Llama-style decoder with seeded random weights;
* :mod:`~kvsched.executor.fused`   -- its small operators, eager or compiled;
* :mod:`~kvsched.executor.kvcache` -- the paged KV pool of exactly M token slots;
* :mod:`~kvsched.executor.batch`   -- one batch's tensor work (packed rows, one forward);
* :mod:`~kvsched.executor.paged`   -- attention over the pool in place (slot tables, torch references);
* :mod:`~kvsched.executor.triton_attention` -- the Triton decode and prefill kernels (imported on use);
* :mod:`~kvsched.executor.gather`  -- the first run's attention over gathered KV (for comparison);
* :mod:`~kvsched.executor.graphs`  -- decode-only batches in bucketed buffers, CUDA graphs on CUDA;
* :mod:`~kvsched.executor.engine`  -- the engine options and the object that plans, runs and times batches;
* :mod:`~kvsched.executor.runner`  -- replay a schedule, stepping the semantic core alongside;
* :mod:`~kvsched.executor.oracle`  -- tokens of each request run alone, and the comparison;
* :mod:`~kvsched.executor.measure` -- measured vs predicted, end-to-end metrics, fits (no torch);
* :mod:`~kvsched.executor.profile` -- microbenchmarks in Vidur's table columns.

Only :mod:`~kvsched.executor.measure` imports without torch; ``pip install -e .[gpu]``
(or ``pip install torch==2.13.0`` for the CPU build) provides it.
"""
