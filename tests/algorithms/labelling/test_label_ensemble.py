"""How Phase 1 turns the O-MAPL seeds' trajectory scores into labels
(jaxil.algorithms.labelling.label: ensemble_scores, top_labels), against
hand-made scores; pure numpy, no compile."""

import numpy as np
import pytest

from jaxil.algorithms.labelling.label import ensemble_scores, top_labels


def test_the_ensemble_standardises_each_seed_over_its_trajectories():
    """Each seed's learned return is identified only up to scale and shift,
    so the ensemble averages each seed's scores standardised over the
    TRAJECTORIES: three seeds that rank 5 trajectories alike on wildly
    different scales give that ranking, and a seed that disagrees weighs
    as much as one that agrees, whatever its scale. Kills standardising
    over the seeds instead (axis 0: a seed's scale would then decide), and
    a plain mean of the raw scores (the large-scale seed would win)."""
    base = np.array([0.1, 0.5, 0.2, 0.9, 0.3])
    scores = np.stack([base, 1000.0 * base - 7.0, 0.01 * base + 3.0])
    z = (base - base.mean()) / base.std()
    np.testing.assert_allclose(ensemble_scores(scores), z, rtol=1e-9)
    # Two seeds agree at a small scale, one disagrees at a large one: the majority wins.
    mixed = np.stack([base, 2.0 * base, -1e4 * base])
    np.testing.assert_allclose(ensemble_scores(mixed), z / 3, rtol=1e-9)
    assert top_labels(ensemble_scores(mixed), top_k=2).tolist() == [False, True, False, True, False]
    assert top_labels(mixed.mean(0), top_k=2).tolist() != [False, True, False, True, False]
    np.testing.assert_array_equal(ensemble_scores(base), base)  # one seed: as it is


def test_top_labels_marks_the_highest_scores_by_count_or_fraction():
    """The top-K (or top fraction) of the scores are the expert labels.
    Kills the lowest scores taken (ascending order), a fraction rounded to
    another count, and a silent label count outside [1, M]."""
    s = np.array([0.3, -1.0, 2.0, 0.7, 0.1, 1.5])
    assert np.flatnonzero(top_labels(s, top_k=3)).tolist() == [2, 3, 5]
    assert np.flatnonzero(top_labels(s, top_frac=0.5)).tolist() == [2, 3, 5]
    assert np.flatnonzero(top_labels(s, top_frac=0.34)).tolist() == [2, 5]
    for k in (0, 7):
        with pytest.raises(ValueError, match="number of expert labels"):
            top_labels(s, top_k=k)
