"""Calibration: from profiling tables to a :class:`CalibratedCost` and its fidelity.

What is measured and what is derived
------------------------------------
* **Non-attention** (the token term): measured, for every model and GPU the
  compute tables cover. The model's time for tau tokens is the embedding plus
  layers x the sum of the per-layer operator medians (Vidur's reading); with
  tensor parallelism, plus two all-reduces of tau x hidden x 2 bytes per layer,
  interpolated from the all-reduce table.
* **Attention**: measured only where an attention table for the same model,
  GPU and tensor-parallel degree is given; the packaged sample covers
  Llama-2-7B on A100 (decode rows at tp = 1, prefill rows at tp = 1 and 8).
  Everywhere else the per-layer tp = 1 fit of the source table is *derived*:
  scaled by the target's share of KV bytes per token and GPU (b1, p2), its
  share of query heads (b2, p1, p4), the GPUs' bandwidth ratio (b1, p2) and
  peak-FLOP ratio (p1, p4); biases (b0, p0) are kept. Then x layers.

Fidelity is reported only on measured rows (see :mod:`kvsched.costmodel.fidelity`).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvsched.costmodel.calibrated import CalibratedCost
from kvsched.costmodel.coeffile import coefficient_params
from kvsched.costmodel.fidelity import ErrorStats, FidelityRow, held_out, neighbour_errors
from kvsched.costmodel.fitting import (
    DECODE_NAMES,
    PREFILL_NAMES,
    TOKEN_FORMS,
    Fit,
    FitError,
    fit_decode,
    fit_prefill,
    fit_token_term,
    predict_decode,
    predict_prefill,
)
from kvsched.costmodel.presets import (
    MODELS,
    GpuSpec,
    ModelSpec,
    get_gpu,
    get_model,
    gpu_from_path,
    model_from_dims,
)
from kvsched.costmodel.profiles import (
    MS,
    AllReduceProfile,
    AttentionProfile,
    ComputeProfile,
    load_allreduce,
    load_attention,
    load_compute,
)
from kvsched.costmodel.surrogate import linear_surrogate
from kvsched.errors import InputError

#: Where the packaged Vidur profiling data lives (same layout as Vidur's ``data/profiling``).
DATA_DIR = Path(__file__).parent / "data" / "vidur" / "profiling"
ATTENTION_SAMPLE = DATA_DIR / "attention_sample" / "a100_Llama-2-7b-hf.csv"
#: Model and GPU of the packaged attention sample.
SAMPLE_SOURCE = ("llama-2-7b", "a100-80gb")
_NETWORK = {"a100-80gb": "a100_pairwise_nvlink", "h100-80gb": "h100_pairwise_nvlink"}
#: Significant digits kept in coefficient files (stable across BLAS builds).
DIGITS = 6
ATTENTION_FORM = "infermax+"
#: Plausible whole-model times of a table's smallest row, in seconds. Vidur's tables are in ms; a table in
#: seconds or microseconds passes every per-cell check (any time in [1e-6, 1e6] ms) yet gives coefficients
#: 1000x off, so the unit is checked on the whole model. Non-attention: a forward pass of any transformer
#: takes at least ~0.2 ms (its kernel launches alone), and a batch of a few tokens never a second. The
#: shipped tables' smallest rows (1 token) take 1.3 ms (Llama-2-7B, H100, tp 8) to 89 ms (Llama-2-70B,
#: A100, tp 1); their attention rows x layers, 0.29 ms (one decode over little KV) and up.
COMPUTE_WINDOW_S = (2e-4, 1.0)
ATTENTION_WINDOW_S = (1e-5, 1.0)
#: The windows' high end holds for batches of up to this many tokens, and grows in proportion beyond.
WINDOW_TOKENS = 256


def packaged_allreduce(gpu: GpuSpec) -> Path | None:
    """The packaged all-reduce table for ``gpu``, if there is one."""
    sub = _NETWORK.get(gpu.name)
    return DATA_DIR / "network" / sub / "all_reduce.csv" if sub else None


def shown_path(path: Path) -> str:
    """A path as coefficient files record it: from ``profiling/`` on when it has one."""
    parts = Path(path).parts
    if "profiling" in parts:
        return "/".join(parts[parts.index("profiling") :])
    return Path(path).name


def _round(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def token_time(params: dict[str, float], n: np.ndarray) -> np.ndarray:
    """A token-term fit's prediction at token counts ``n``."""
    return CalibratedCost.from_params(**params).non_attention(n)


# ------------------------------------------------------------ attention scaling
def attention_scale(
    src: tuple[ModelSpec, GpuSpec, int], dst: tuple[ModelSpec, GpuSpec, int]
) -> dict[str, float]:
    """Factors taking per-layer attention coefficients from ``src`` to ``dst`` (model, GPU, tp)."""
    (sm, sg, st), (dm, dg, dt) = src, dst
    kv = (dm.kv_heads * dm.head_dim * dm.dtype_bytes / dt) / (sm.kv_heads * sm.head_dim * sm.dtype_bytes / st)
    q = (dm.heads * dm.head_dim / dt) / (sm.heads * sm.head_dim / st)
    bw = sg.mem_bw / dg.mem_bw
    fl = sg.peak_flops / dg.peak_flops
    return {"b0": 1.0, "b1": kv * bw, "b2": q, "p0": 1.0, "p1": q * fl, "p2": kv * bw, "p4": q * fl}


@dataclass(frozen=True, slots=True)
class Calibration:
    """The result of :func:`calibrate`: the model, where its terms come from, and its fidelity.

    ``folds`` is the k used on the compute table's rows: ``folds_requested`` capped at their number
    (beyond it, every fold holds one row: leave-one-out).
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    form: str
    cost: CalibratedCost
    fidelity: tuple[FidelityRow, ...]
    terms: dict[str, str]
    r2: dict[str, float]
    sources: dict[str, str | None]
    data_sha256: str
    folds: int
    seed: int
    meta: dict[str, Any] = field(default_factory=dict)
    folds_requested: int | None = None

    def document(self) -> dict[str, Any]:
        """The coefficient file's JSON document (every coefficient listed, zeros included, and counted)."""
        params, count = coefficient_params(self.cost)
        return {
            "schema_version": 1,
            "kind": "kvsched.cost-coefficients",
            "name": self.cost.name,
            "params": params,
            "meta": {
                "model": self.model.name,
                "gpu": self.gpu.name,
                "tp": self.tp,
                "form": self.form,
                "unit": "seconds",
                **count,
                "terms": self.terms,
                "r2": {k: _round(v) for k, v in self.r2.items()},
                "fidelity": [row.as_dict() for row in self.fidelity],
                "cv": {
                    "folds": self.folds,
                    "seed": self.seed,
                    # Recorded only when --folds was capped, so that files fitted as asked stay as they were.
                    **(
                        {"folds_requested": self.folds_requested}
                        if self.folds_requested not in (None, self.folds)
                        else {}
                    ),
                },
                "sources": self.sources,
                "data_sha256": self.data_sha256,
                **self.meta,
            },
        }


# ------------------------------------------------------------ the calibration
def _resolve(
    prof: ComputeProfile, path: Path, model: str | ModelSpec | None, gpu: str | GpuSpec | None
) -> tuple[ModelSpec, GpuSpec]:
    heads, kv_heads, hidden, ffn, vocab = prof.dims
    found = model_from_dims(heads, kv_heads, hidden, ffn, vocab)
    if model is None:
        if found is None:
            # ("pass --model" said before, but no --model matches a shape no preset has: a dead end.)
            raise InputError(
                f"{path}: its shape (n_head={heads}, n_kv_head={kv_heads}, n_embd={hidden}, "
                f"n_expanded_embd={ffn}) is no preset model's ({', '.join(MODELS)}), and calibrate fits "
                "operator tables of a preset's shape; a table of `profile --model tiny` is for the "
                "executor's own checks (fit its batches.csv with calibrate --from-replay)"
            )
        spec = found
    else:
        spec = get_model(model) if isinstance(model, str) else model
        if (spec.heads, spec.kv_heads, spec.hidden, spec.ffn) != (heads, kv_heads, hidden, ffn):
            raise InputError(
                f"--model: {spec.name} does not match {path} (n_head={heads}, n_kv_head={kv_heads}, "
                f"n_embd={hidden}, n_expanded_embd={ffn})"
            )
    if gpu is None:
        g = gpu_from_path(str(path))
        if g is None:
            raise InputError(f"--gpu: no GPU named in the path {path}; pass --gpu")
    else:
        g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    return spec, g


def _check_unit(
    path: Path,
    column: str,
    what: str,
    seconds: float,
    window: tuple[float, float],
    floor: str,
    tokens: int = 1,
) -> None:
    """One :class:`InputError` when a whole-model time (``seconds``, read as ms) lies outside ``window``.

    ``floor`` says why nothing is faster than the window's low end. The high end is for a batch of up to
    :data:`WINDOW_TOKENS` tokens and grows with ``tokens`` beyond (a table whose smallest row is 4096
    tokens of a 70B model takes about 2 s there). The message says which unit the table looks like it
    was written in: 1000x too small is seconds, 1000x too large microseconds.
    """
    lo, hi = window[0], window[1] * max(1.0, tokens / WINDOW_TOKENS)
    if lo <= seconds <= hi:
        return
    if seconds < lo:
        unit = "seconds, not ms" if seconds * 1e3 >= lo else "neither ms nor seconds (too small)"
        side = f"{floor} takes at least {lo:g} s"
    else:
        unit = "µs, not ms" if seconds / 1e3 <= hi else "neither ms nor µs (too large)"
        side = f"so small a batch never takes {hi:g} s"
    raise InputError(
        f"{path}: column {column}: {what} is {seconds / MS:.4g} ms = {seconds:.4g} s, but {side}: "
        f"the times look like {unit} (Vidur's tables are in milliseconds)"
    )


def _check_attention_unit(path: Path, profiles: Sequence[AttentionProfile | None], layers: int) -> None:
    """:func:`_check_unit` on an attention table's smallest row, times ``layers``."""
    rows = [
        (t, term, p.tp)
        for p in profiles
        if p is not None
        for term, t in (("decode", p.decode_time), ("prefill", p.prefill_time))
        if t.size
    ]
    if not rows:
        return
    t, term, tp = min(rows, key=lambda r: float(r[0].min()))
    _check_unit(
        path,
        "'median_ms'",
        f"its smallest row (a {term} row at tp = {tp}) x {layers} layers",
        float(t.min()) * layers,
        ATTENTION_WINDOW_S,
        "attention over every layer (a kernel launch per layer)",
    )


def _need_cv_rows(path: Path, n_rows: int, folds: int, minimum: int, what: str) -> None:
    """One :class:`InputError` when ``what``, fitted on ``n_rows`` rows, cannot be cross-validated.

    Each fold is refitted on the rows outside it, which must number ``minimum`` too: with 3 rows and
    a fit that needs 3, every fold is left with 2. Checked here, where the file and --folds are known,
    so the count in the message is the table's, not a fold's.
    """

    def train(n: int) -> int:  # rows left to fit when the largest fold is held out (kfold's split)
        return n - -(-n // max(2, min(folds, n)))

    if n_rows >= minimum and train(n_rows) >= minimum:
        return
    need = next(n for n in itertools.count(minimum) if train(n) >= minimum)
    raise InputError(
        f"{path}: {what} needs at least {need} rows with --folds {folds}, got {n_rows} (a fit needs "
        f"{minimum}, and each cross-validation fold is refitted without its held-out rows)"
    )


def _non_attention(
    prof: ComputeProfile, model: ModelSpec, gpu: GpuSpec, tp: int, all_reduce: str | Path | None
) -> tuple[np.ndarray, AllReduceProfile | None]:
    y = prof.total(model.layers)
    if tp == 1:
        if all_reduce is not None:  # ignored without a word, a mistyped or wrong table would go unseen
            raise InputError(f"--all-reduce: {all_reduce}: an all-reduce table is read only with --tp > 1")
        return y, None
    path = Path(all_reduce) if all_reduce is not None else packaged_allreduce(gpu)
    if path is None:
        raise InputError(
            f"--all-reduce: tp = {tp} needs an all-reduce table and none is packaged for {gpu.name}"
        )
    ar = load_allreduce(path, tp)
    nbytes = prof.num_tokens * model.hidden * model.dtype_bytes
    return y + 2 * model.layers * ar.time_of(nbytes), ar


def calibrate(
    compute: str | Path,
    *,
    model: str | ModelSpec | None = None,
    gpu: str | GpuSpec | None = None,
    tp: int = 1,
    form: str = "stepped",
    attention: str | Path | None = None,
    attention_model: str | None = None,
    attention_gpu: str | None = None,
    all_reduce: str | Path | None = None,
    folds: int = 10,
    seed: int = 0,
    report_forms: Sequence[str] = TOKEN_FORMS,
) -> Calibration:
    """Fit a :class:`CalibratedCost` from profiling tables and measure its held-out fidelity.

    Parameters
    ----------
    compute
        Compute (``mlp.csv``) table.
    model, gpu
        Presets; by default the model is recognised from the table's dimensions
        and the GPU from a directory in its path (``.../a100/...``).
    tp
        Tensor-parallel degree (rows of that degree; all-reduces added when > 1).
    form
        Token-term form of the model written (see :mod:`kvsched.costmodel.fitting`).
    attention
        Attention table; default the packaged Llama-2-7B/A100 sample.
    attention_model, attention_gpu
        Model and GPU the attention table was measured on (default: the
        sample's, or the target's for a table given explicitly).
    all_reduce
        All-reduce table for tp > 1; default the packaged one for the GPU.
    folds, seed
        k-fold cross-validation settings.
    report_forms
        Token-term forms to report fidelity for (``form`` is always included).
    """
    if form not in TOKEN_FORMS:
        raise InputError(f"--form: unknown form {form!r} (known: {', '.join(TOKEN_FORMS)})")
    if folds < 2:
        raise InputError(f"--folds: must be >= 2, got {folds}")
    path = Path(compute)
    prof = load_compute(path, tp)
    spec, g = _resolve(prof, path, model, gpu)
    L = spec.layers
    n = prof.num_tokens
    _check_unit(
        path,
        "time_stats.<op>.median",
        f"the model's non-attention time at num_tokens = {int(n[0])} (embedding + {L} layers x the "
        "operator medians)",
        float(prof.total(L)[0]),
        COMPUTE_WINDOW_S,
        "a forward pass (its kernel launches alone)",
        tokens=int(n[0]),
    )
    # Resolved before any fit, so that a mistyped flag fails at once.
    if attention is None:
        att_path = ATTENTION_SAMPLE
        src_model = get_model(attention_model or SAMPLE_SOURCE[0], "--attention-model")
        src_gpu = get_gpu(attention_gpu or SAMPLE_SOURCE[1], "--attention-gpu")
    else:
        att_path = Path(attention)
        src_model = get_model(attention_model, "--attention-model") if attention_model else spec
        src_gpu = get_gpu(attention_gpu, "--attention-gpu") if attention_gpu else g
    y, ar = _non_attention(prof, spec, g, tp, all_reduce)
    if (y <= 0).any():
        # Fits and fidelity are relative (weights and errors 1 / time): a zero time has no relative error.
        zero = int(n[np.argmax(y <= 0)])
        raise InputError(
            f"{path}: every operator time at num_tokens = {zero}, tp = {tp} is 0: a profiled row needs a "
            "non-zero time"
        )
    _need_cv_rows(path, n.size, folds, 3, f"the token term (distinct num_tokens at tp = {tp})")

    # ---- token term: every reported form, held out
    forms = list(dict.fromkeys([form, *report_forms]))
    rows: list[FidelityRow] = []
    token_fit = {}
    token_pred = {}
    fit_tokens = _naming(path, fit_token_term)
    for f in forms:
        fit = fit_tokens(f, n, y)

        def fp(train: np.ndarray, test: np.ndarray, f: str = f) -> np.ndarray:
            return token_time(fit_tokens(f, n[train], y[train]).params, n[test])

        token_pred[f] = held_out(n.size, folds, seed, fp)
        token_fit[f] = fit
        rows.append(FidelityRow("non-attention", f, ErrorStats.of(token_pred[f], y), fit.r2))
    nb = neighbour_errors(n, y)
    rows.append(
        FidelityRow(
            "non-attention",
            "neighbours",
            ErrorStats(
                nb.size,
                float(nb.mean()),
                float(np.percentile(nb, 95)),
                float(nb.max()),
                int((nb > 0.1).sum()),
            ),
        )
    )

    # ---- attention: measured where the table matches, derived elsewhere
    same = src_model.name == spec.name and src_gpu.name == g.name
    here = load_attention(att_path, tp) if same else None
    base = load_attention(att_path, 1)
    _check_attention_unit(att_path, (base, here), src_model.layers)
    # The curves that turn an attention row into a whole-batch time, for the weights.
    target_curve = (n, y)
    base_curve = target_curve if same and tp == 1 else _source_curve(src_model, src_gpu)
    params: dict[str, float] = {}
    terms: dict[str, str] = {}
    r2 = {"non_attention": token_fit[form].r2}
    scale = attention_scale((src_model, src_gpu, 1), (spec, g, tp))
    src_label = f"{src_model.name} on {src_gpu.name}"
    att_pred: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    base_fit: dict[str, dict[str, float]] = {}
    for term in ("decode", "prefill"):
        fitter, predictor, names = _TERMS[term]
        fitter = _naming(att_path, fitter)
        measured = here is not None and _rows(here, term)[0].size >= len(names)
        tok, kv, t = _rows(here if measured else base, term)  # type: ignore[arg-type]
        if t.size == 0:
            raise InputError(f"{att_path}: no {term} rows at tp = 1 to fit the {term}-attention term")
        w = _batch_weights(
            tok, t, target_curve if measured else base_curve, L if measured else src_model.layers
        )
        fit = fitter(tok, kv, t, w)
        per_layer = dict(fit.params)
        btok, bkv, bt = _rows(base, term)
        if bt.size:
            base_fit[term] = fitter(
                btok, bkv, bt, _batch_weights(btok, bt, base_curve, src_model.layers)
            ).params
        if measured:
            _need_cv_rows(att_path, t.size, folds, len(names), f"{term} attention ({term} rows at tp = {tp})")
            terms[f"{term}_attention"] = (
                f"measured: {shown_path(att_path)} ({t.size} {term} rows at tp={tp}), per layer x {L} layers"
            )

            def fp(tr: np.ndarray, te: np.ndarray, f=fitter, p=predictor, d=(tok, kv, t, w)) -> np.ndarray:
                tok_, kv_, t_, w_ = d
                fitted = f(tok_[tr], kv_[tr], t_[tr], None if w_ is None else w_[tr]).params
                return p(fitted, tok_[te], kv_[te])

            pred = held_out(t.size, folds, seed, fp)
            att_pred[term] = (tok, t, pred)
            rows.append(FidelityRow(f"{term} attn (layer)", ATTENTION_FORM, ErrorStats.of(pred, t), fit.r2))
            r2[f"{term}_attention"] = fit.r2
        else:
            per_layer = {k: v * scale[k] for k, v in per_layer.items()}
            factors = ", ".join(f"{k} x{scale[k]:.3g}" for k in names if scale[k] != 1.0)
            terms[f"{term}_attention"] = (
                f"derived: the tp=1 fit to {shown_path(att_path)} ({src_label}, {t.size} rows) scaled to "
                f"{spec.name} on {g.name} at tp={tp} ({factors or 'no scaling'}), x {L} layers"
            )
        params.update({k: L * v for k, v in per_layer.items()})

    # ---- how well the derivation works where it can be checked: other tp rows of the same table.
    # The check is on the attention table's own model and GPU (the packaged sample: Llama-2-7B on A100),
    # whatever the target, so its row names them: under another model's title it would read as that
    # model's figure.
    for other in sorted(set(_tps(att_path)) - {1}):
        chk = load_attention(att_path, other)
        if chk.prefill_chunk.size < 2 or "prefill" not in base_fit:
            continue
        s = attention_scale((src_model, src_gpu, 1), (src_model, src_gpu, other))
        scaled = {k: v * s[k] for k, v in base_fit["prefill"].items()}
        pred = predict_prefill(scaled, chk.prefill_chunk, chk.prefill_kv)
        rows.append(
            FidelityRow(
                f"prefill attn (layer) tp={other}, derived ({src_label})",
                ATTENTION_FORM,
                ErrorStats.of(pred, chk.prefill_time),
            )
        )

    # ---- whole batches: measured attention rows whose token count has a compute row
    if att_pred:
        index = {float(v): i for i, v in enumerate(n)}
        for f in forms:
            meas, pred = [], []
            for tok, t, t_pred in att_pred.values():
                for j, k in enumerate(tok):
                    i = index.get(float(k))
                    if i is not None:
                        meas.append(y[i] + L * t[j])
                        pred.append(token_pred[f][i] + L * t_pred[j])
            if meas:
                rows.append(FidelityRow("whole batch", f, ErrorStats.of(np.array(pred), np.array(meas))))

    # ---- the model
    params.update(token_fit[form].params)
    cost = CalibratedCost.from_params(**{k: _round(v) for k, v in params.items()})
    non_att = (
        f"measured: {shown_path(path)}: embedding + {L} layers x sum of per-layer operator medians at tp={tp}"
    )
    if ar is not None:
        non_att += (
            f", + 2 x {L} all-reduces of tau x {spec.hidden} x {spec.dtype_bytes} B ({shown_path(ar.path)})"
        )
    if prof.missing_ops:
        non_att += f" (operators absent, counted as 0: {', '.join(prof.missing_ops)})"
    terms = {"non_attention": non_att, **terms}
    terms["prefill_attention"] += "; p3 = 0 (one prefill per row: not separable from p0)"
    sur = linear_surrogate(cost, form="infermax")
    surrogate = {
        "name": sur.model.name,
        "params": {k: _round(v) for k, v in sur.model.coefficients().items()},  # type: ignore[union-attr]
        "probe_batches": sur.stats.n,
        "mean_rel_err": _round(sur.stats.mean),
        "max_rel_err": _round(sur.stats.max),
    }
    digest = hashlib.sha256()
    for arr in (
        n,
        y,
        base.decode_batch,
        base.decode_kv,
        base.decode_time,
        base.prefill_chunk,
        base.prefill_kv,
        base.prefill_time,
    ):
        digest.update(np.ascontiguousarray(arr, dtype=np.float64).tobytes())
    return Calibration(
        model=spec,
        gpu=g,
        tp=tp,
        form=form,
        cost=cost,
        fidelity=tuple(rows),
        terms=terms,
        r2=r2,
        sources={
            "compute": shown_path(path),
            "attention": shown_path(att_path),
            "all_reduce": shown_path(ar.path) if ar is not None else None,
        },
        data_sha256=digest.hexdigest(),
        # What kfold does with more folds than rows: each row its own fold.
        folds=min(folds, n.size),
        seed=seed,
        meta={"linear_surrogate": surrogate},
        folds_requested=folds,
    )


def _naming(path: Path, fit: Callable[..., Fit]) -> Callable[..., Fit]:
    """``fit``, with a :class:`FitError` it raises prefixed by the table ``path`` (fits do not know files)."""

    def named(*args: Any, **kwargs: Any) -> Fit:
        try:
            return fit(*args, **kwargs)
        except FitError as exc:
            raise InputError(f"{path}: {exc}") from None

    return named


_TERMS = {
    "decode": (fit_decode, predict_decode, DECODE_NAMES),
    "prefill": (fit_prefill, predict_prefill, PREFILL_NAMES),
}

#: Packaged compute tables by (model, GPU).
PACKAGED_COMPUTE = {
    ("llama-2-7b", "a100-80gb"): "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv",
    ("llama-2-7b", "h100-80gb"): "compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv",
    ("llama-3-8b", "a100-80gb"): "compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv",
    ("codellama-34b", "a100-80gb"): "compute/a100/codellama/CodeLlama-34b-Instruct-hf/mlp.csv",
    ("codellama-34b", "h100-80gb"): "compute/h100/codellama/CodeLlama-34b-Instruct-hf/mlp.csv",
    ("llama-2-70b", "a100-80gb"): "compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv",
    ("llama-2-70b", "h100-80gb"): "compute/h100/meta-llama/Llama-2-70b-hf/mlp.csv",
}


#: The coefficient files shipped in ``kvsched/costmodel/coefficients/``: (model, GPU, tp).
#: Llama-2-70B needs two 80 GB GPUs for its weights, as in seed 004 Sec. 7.
SHIPPED = (
    ("llama-2-7b", "a100-80gb", 1),
    ("llama-2-7b", "h100-80gb", 1),
    ("llama-3-8b", "a100-80gb", 1),
    ("codellama-34b", "a100-80gb", 1),
    ("codellama-34b", "h100-80gb", 1),
    ("llama-2-70b", "a100-80gb", 2),
    ("llama-2-70b", "h100-80gb", 2),
)


def coefficient_name(model: str, gpu: str, tp: int) -> str:
    """File name of a coefficient set: ``MODEL_GPU_tpN.json``."""
    return f"{model}_{gpu}_tp{tp}.json"


def packaged_compute(model: ModelSpec, gpu: GpuSpec) -> Path | None:
    """The packaged compute table for ``model`` on ``gpu``, if there is one."""
    rel = PACKAGED_COMPUTE.get((model.name, gpu.name))
    return DATA_DIR / rel if rel else None


def _source_curve(model: ModelSpec, gpu: GpuSpec) -> tuple[np.ndarray, np.ndarray] | None:
    """The source model's measured non-attention curve at tp = 1, when it is packaged."""
    path = packaged_compute(model, gpu)
    if path is None:
        return None
    prof = load_compute(path, 1)
    return prof.num_tokens, prof.total(model.layers)


def _rows(prof: AttentionProfile, term: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if term == "decode":
        return prof.decode_batch, prof.decode_kv, prof.decode_time
    return prof.prefill_chunk, prof.prefill_kv, prof.prefill_time


def _batch_weights(
    tokens: np.ndarray, t: np.ndarray, curve: tuple[np.ndarray, np.ndarray] | None, layers: int
) -> np.ndarray | None:
    """Weights 1 / (a row's whole-batch time per layer), or None to weight by the attention time.

    The targets are on batch time, so an attention row's error counts relative to
    the batch it belongs to: its token count's non-attention time (interpolated on
    the measured curve) plus the attention itself.
    """
    if curve is None:
        return None
    n, y = curve
    return 1.0 / (np.interp(tokens, n, y) / layers + t)


def _tps(path: Path) -> list[int]:
    import pandas as pd

    col = pd.read_csv(path, usecols=["num_tensor_parallel_workers"])["num_tensor_parallel_workers"]
    return sorted({int(v) for v in col})
