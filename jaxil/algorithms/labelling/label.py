"""Phase 1: preferences → O-MAPL → learned returns → expert labels.

    pairs = sample_query_pairs(dataset, 1000, segment_len=None, seed=0)
    prefs = GroundTruthOracle(flip_rate=0.1)(dataset, pairs)
    fit = fit_preferences(dataset, pairs, prefs, seeds=3, updates=2000)
    scores = fit.scores                       # [S, M] learned returns
    labels = top_labels(scores.mean(0), top_k=200)
    label_metrics(labels, dataset.expert, scores[0], dataset.episode_return)

Every trajectory is scored by its learned return Σ_t r_t (O-MAPL's implicit
reward); the top K (or top fraction) become D_E for Phase 2. Several seeds
train in one program (`vmap`); their scores are averaged after
standardisation for the ensemble labels, and each seed's labels are also
reported on their own.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxil.runs import engine
from jaxil.runs.loggers import LoggerFactory
from jaxil.data.format import Dataset, canonical_json
from jaxil.algorithms.offline import OMAPLConfig, PreferenceData, make_learner
from jaxil.algorithms.offline.omapl import learned_returns
from jaxil.data.preferences import QueryPairs, segments
from jaxil.runs.sharding import RunsLayout, check_batch_split, make_mesh, num_devices
from jaxil.algorithms.offline.train import chunk_fn, expand_grid, init_runs


@dataclasses.dataclass
class PreferenceFit:
    """O-MAPL trained on answered queries: `states` stacked over seeds."""

    learner: Any
    states: Any
    scores: np.ndarray  # [S, M] learned returns of every trajectory
    history: list[dict]  # per chunk: update, mean metrics over seeds
    num_pairs: int
    seconds: float


def fit_preferences(
    dataset: Dataset,
    pairs: QueryPairs,
    prefs: np.ndarray,
    *,
    seeds: int = 1,
    updates: int = 2000,
    chunk: int = 250,
    seed: int = 0,
    hparams: Optional[dict[str, float]] = None,
    progress: bool = True,
    batch_devices: int = 1,
    loggers: Sequence[LoggerFactory] = (),
    **config,
) -> PreferenceFit:
    """Train O-MAPL on the answered queries (NaN answers dropped), `seeds`
    runs vmapped in one program, and score every trajectory of `dataset`.

    `config` goes to `OMAPLConfig` (`hidden`, `batch_size`, ...); `hparams`
    overrides `OMAPLHParams` fields (`beta`, `lr_q` ...). `batch_devices`:
    split each update's batch of pairs over this many devices (data-parallel,
    [`jaxil.runs.sharding`][jaxil.runs.sharding]; `batch_size` must divide by
    it); the fit agrees with one device's to float32 round-off. `loggers`:
    where the metrics rows go ([`jaxil.runs.loggers`][jaxil.runs.loggers]; runs
    named `run<i>-seed<s>`; the fit writes no run directory).
    """

    if updates <= 0 or chunk <= 0:
        raise ValueError("updates and chunk must be positive")
    chunk = min(chunk, updates)
    if updates % chunk:
        raise ValueError(f"updates ({updates}) must be a multiple of chunk ({chunk})")
    spec = dataset.spec
    learner = make_learner("omapl", spec, **config)
    data = PreferenceData.from_pairs(dataset, pairs, prefs)
    runs = expand_grid({k: [v] for k, v in (hparams or {}).items()}, seeds)
    states = init_runs(learner, runs, seed)
    lay = None
    if batch_devices > 1:
        check_batch_split(learner.config.batch_size, batch_devices)
        num_devices(1, len(runs), batch_devices)  # enough devices?
        lay = RunsLayout(make_mesh(1, batch_devices), len(runs))
        states, data = lay.place(states), lay.replicate(data)
    step = chunk_fn(learner, chunk, lay.mesh) if lay else chunk_fn(learner, chunk)

    def postfix(v):
        return dict(acc=f"{v['pair_accuracy'].mean():.2f}",
                    pref=f"{v['preference_loss'].mean():.3f}")

    program = engine.Program(
        name="O-MAPL (Phase 1 labelling)", step_key="update", num_chunks=updates // chunk,
        steps_per_chunk=chunk, step_unit=chunk,
        run_ids=[dict(run=r.index, seed=r.seed) for r in runs],
        run_labels=[f"seed {r.seed}" for r in runs], init=lambda: states,
        chunk=lambda s, c: step(s, data), evaluate=lambda s, c: {}, postfix=postfix,
        fetch=lay.gather if lay else jax.device_get)
    t0 = time.perf_counter()
    result = engine.run(program, progress=progress, loggers=loggers,
                        log_names=[f"run{r.index}-seed{r.seed}" for r in runs])
    states = result.state
    history = []
    for u in sorted({r["update"] for r in result.rows}):
        at = [r for r in result.rows if r["update"] == u]
        names = [k for k in at[0] if k not in ("update", "run", "seed")]
        history.append(dict(update=u, **{k: float(np.mean([r[k] for r in at])) for k in names}))
    if lay:  # back to one device, as an unsharded fit returns it
        states = jax.tree.map(jnp.asarray, lay.gather(states))
    scores = score_trajectories(learner.config, spec, states.params, states.hparams.gamma, dataset)
    return PreferenceFit(learner, states, scores, history, data.num_pairs,
                         time.perf_counter() - t0)


def score_trajectories(config: OMAPLConfig, spec, params, gamma, dataset: Dataset,
                       batch: int = 256) -> np.ndarray:
    """`[S, M]` learned returns of every whole trajectory, for S stacked
    parameter sets (`params`/`gamma` with a leading seed axis)."""
    M = dataset.num_trajectories
    fn = _score_fn(config, spec)
    out = []
    for lo in range(0, M, batch):
        idx = np.arange(lo, min(lo + batch, M))
        seg = segments(dataset, idx, np.zeros_like(idx), None)
        out.append(np.asarray(fn(params, gamma, jax.tree.map(jnp.asarray, seg))))
    return np.concatenate(out, axis=1)


_SCORE_FNS: dict = {}


def _score_fn(config, spec):
    key = (config, spec)
    if key not in _SCORE_FNS:
        _SCORE_FNS[key] = jax.jit(jax.vmap(
            lambda p, g, seg: learned_returns(spec, config, p, g, seg), in_axes=(0, 0, None)))
    return _SCORE_FNS[key]


def ensemble_scores(scores: np.ndarray) -> np.ndarray:
    """Mean over seeds of each seed's standardised scores `[S, M] -> [M]`
    (learned rewards are identified only up to scale and shift per seed)."""
    s = np.asarray(scores, np.float64)
    if s.ndim == 1:
        return s
    z = (s - s.mean(1, keepdims=True)) / np.maximum(s.std(1, keepdims=True), 1e-12)
    return z.mean(0)


def top_labels(scores: np.ndarray, top_k: Optional[int] = None,
               top_frac: Optional[float] = None) -> np.ndarray:
    """`[M]` bool: the `top_k` highest scores (or the top `top_frac`)."""
    scores = np.asarray(scores)
    if scores.ndim != 1:
        raise ValueError(f"top_labels takes one score per trajectory [M], got shape {scores.shape}")
    if not np.all(np.isfinite(scores)):
        raise ValueError("trajectory scores contain NaN/inf; the preference model diverged")
    M = scores.shape[0]
    if (top_k is None) == (top_frac is None):
        raise ValueError("give exactly one of top_k (a count) or top_frac (a fraction)")
    k = int(top_k) if top_k is not None else int(round(float(top_frac) * M))
    if not 1 <= k <= M:
        raise ValueError(f"the number of expert labels must be in [1, {M}], got {k}")
    order = np.argsort(-scores, kind="stable")
    labels = np.zeros(M, bool)
    labels[order[:k]] = True
    return labels


def label_metrics(labels: np.ndarray, truth: np.ndarray, scores: np.ndarray,
                  true_returns: np.ndarray) -> dict[str, float]:
    """Labelling quality against ground truth: accuracy, precision, recall,
    F1 of `labels` vs `truth`; Spearman rank correlation of learned
    `scores` vs `true_returns`; AUC of the scores for the true experts."""
    from scipy.stats import rankdata, spearmanr

    labels, truth = np.asarray(labels, bool), np.asarray(truth, bool)
    if labels.shape != truth.shape:
        raise ValueError(f"labels {labels.shape} and ground truth {truth.shape} differ in shape")
    tp = int(np.sum(labels & truth))
    precision = tp / max(int(labels.sum()), 1)
    recall = tp / max(int(truth.sum()), 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-12)
    n_pos, n_neg = int(truth.sum()), int((~truth).sum())
    auc = float("nan")
    if n_pos and n_neg:
        r = rankdata(scores)
        auc = (r[truth].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return dict(
        accuracy=float(np.mean(labels == truth)), precision=float(precision),
        recall=float(recall), f1=float(f1), auc=float(auc),
        spearman=float(spearmanr(scores, true_returns).statistic),
        num_labelled=int(labels.sum()), num_true=int(truth.sum()),
    )


def labelled_copy(dataset: Dataset, labels: np.ndarray, provenance: dict) -> Dataset:
    """A new dataset whose `expert` flags are the Phase-1 `labels`.

    The input is not modified. The ground truth stays recoverable from the
    tiers (`tier_names`) and is kept in `creation_args["phase1"]` along
    with how the labels were made."""
    labels = np.asarray(labels, bool)
    if labels.shape != (dataset.num_trajectories,):
        raise ValueError(f"labels have shape {labels.shape}; the dataset has "
                         f"{dataset.num_trajectories} trajectories")
    args = dict(dataset.info.creation_args)
    args["phase1"] = dict(provenance, ground_truth_expert=np.flatnonzero(dataset.expert).tolist(),
                          labelled_expert=np.flatnonzero(labels).tolist())
    info = dataclasses.replace(dataset.info, recipe=(dataset.info.recipe + "+phase1").lstrip("+"),
                               creation_args_json=canonical_json(args))
    return dataset.replace(expert=labels, info=info)


def summary_line(metrics: dict) -> str:
    return (f"precision {metrics['precision']:.3f}  recall {metrics['recall']:.3f}  "
            f"accuracy {metrics['accuracy']:.3f}  AUC {metrics['auc']:.3f}  "
            f"Spearman {metrics['spearman']:.3f}")


def to_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
