"""`jaxil label` and `jaxil pipeline`: unlabeled data → labels → MisoDICE.

    jaxil label runs/data/smax-3m-misodice-200e-1000p.npz --oracle ground_truth --queries 1000 --top-k 200
    jaxil label smax-3m/misodice-200e-1000p --oracle external --external mymod:ask_llm --cache answers.jsonl
    jaxil pipeline smax:3m --seeds 4          # Phase 1, Phase 2, and the two comparisons

`label` never modifies its input: it writes a labelled copy (`expert` =
the Phase-1 labels) and `<out>.labels.json` (labels, scores, metrics
against the hidden ground truth, the oracle's report), which `jaxil train
--labels` also accepts.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from jaxil.data.format import Dataset, save
from jaxil.runs.io_atomic import atomic_write_text
from jaxil.algorithms.labelling.label import (
    ensemble_scores,
    fit_preferences,
    label_metrics,
    labelled_copy,
    to_json,
    top_labels,
)
from jaxil.data.preferences import distinct_query_pairs
from jaxil.algorithms.labelling import oracles

ORACLES = ("ground_truth", "semantic", "external")


def make_oracle(name: str, *, flip_rate: float = 0.0, seed: int = 0,
                external: Optional[Callable[[str], str]] = None,
                cache: Optional[str] = None, timeout: Optional[float] = None,
                progress: bool = True):
    """Build an oracle by name (see
    [`jaxil.algorithms.labelling.oracles`][jaxil.algorithms.labelling.oracles]);
    `timeout` is the external oracle's limit per call, in seconds, and
    `progress` its progress bar."""

    if name == "ground_truth":
        return oracles.GroundTruthOracle(flip_rate=flip_rate, seed=seed)
    if flip_rate:
        raise ValueError("--flip-rate applies to the ground_truth oracle only")
    if name == "semantic":
        return oracles.SMAXSemanticOracle()
    if name == "external":
        if external is None:
            raise ValueError("the external oracle needs a callable: --external MODULE:FUNCTION "
                             "(a function str -> '#1' | '#2')")
        return oracles.ExternalOracle(external, cache_path=cache, timeout=timeout,
                                      progress=progress)
    raise ValueError(f"unknown oracle {name!r}; choose one of {', '.join(ORACLES)}")


def load_callable(spec: str) -> Callable[[str], str]:
    """`"package.module:function"` -> the function."""
    mod, sep, fn = spec.partition(":")
    if not sep or not mod or not fn:
        raise ValueError(f"--external takes MODULE:FUNCTION, got {spec!r}")
    try:
        f = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--external {spec!r}: {e}") from None
    if not callable(f):
        raise ValueError(f"--external {spec!r} is not callable")
    return f


@dataclasses.dataclass
class LabelOutcome:
    labels: np.ndarray  # [M] bool, from the ensemble of seeds
    scores: np.ndarray  # [S, M]
    metrics: dict  # ensemble metrics vs ground truth
    per_seed: list[dict]  # metrics of each seed's own top-K
    oracle: dict  # name, queries asked (distinct pairs) and requested, answered, report
    fit_seconds: float
    history: list[dict]


def phase1(dataset: Dataset, oracle, *, queries: int = 1000, segment_len: Optional[int] = None,
           top_k: Optional[int] = None, top_frac: Optional[float] = None, seeds: int = 3,
           updates: int = 1000, seed: int = 0, progress: bool = True, hparams=None,
           **config) -> LabelOutcome:
    """Ask `oracle` about `queries` distinct random pairs
    ([`distinct_query_pairs`][jaxil.data.preferences.distinct_query_pairs]:
    every pair once if the dataset has fewer), fit O-MAPL (`seeds` vmapped),
    label the top trajectories by learned return. `outcome.oracle` records the
    pairs asked (`queries`), the budget (`requested`) and the pairs answered
    (`answered`)."""
    pairs = distinct_query_pairs(dataset, queries, segment_len, seed=seed)
    prefs = np.asarray(oracle(dataset, pairs), np.float32)
    answered = int(np.isfinite(prefs).sum())
    fit = fit_preferences(dataset, pairs, prefs, seeds=seeds, updates=updates, seed=seed,
                          progress=progress, hparams=hparams, **config)
    truth = np.asarray(dataset.expert, bool)
    if top_k is None and top_frac is None:
        raise ValueError("give top_k or top_frac: how many trajectories to label expert")
    per_seed = [label_metrics(top_labels(s, top_k, top_frac), truth, s, dataset.episode_return)
                for s in fit.scores]
    ens = ensemble_scores(fit.scores)
    labels = top_labels(ens, top_k, top_frac)
    report = dict(getattr(oracle, "report", {}) or {})
    return LabelOutcome(
        labels=labels, scores=fit.scores,
        metrics=label_metrics(labels, truth, ens, dataset.episode_return), per_seed=per_seed,
        oracle=dict(name=getattr(oracle, "name", type(oracle).__name__), queries=len(pairs),
                    requested=int(queries), answered=answered, segment_len=segment_len,
                    report=report),
        fit_seconds=fit.seconds, history=fit.history,
    )


def write_labels(dataset: Dataset, outcome: LabelOutcome, out: Path, provenance: dict) -> Path:
    """The labelled copy at `out` and its `.labels.json` sidecar (both atomic)."""
    save(labelled_copy(dataset, outcome.labels, provenance), out)
    side = out.with_suffix(".labels.json")
    atomic_write_text(side, to_json(dict(
        provenance, expert=outcome.labels.astype(bool).tolist(), metrics=outcome.metrics,
        per_seed=outcome.per_seed, oracle=outcome.oracle, scores=outcome.scores.round(5).tolist(),
        fit_seconds=outcome.fit_seconds)))
    return side


# ----------------------------------------------------------------------------- CLI


