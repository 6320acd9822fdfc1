"""The statistics of experiments/irl/diagnose_sft.py against hand computation."""

from __future__ import annotations

import numpy as np

from experiments.irl.diagnose_sft import law_stats


def test_law_stats_match_hand_computation():
    """One state, two agents, three actions: fails if KL ran the other way
    (KL(π ‖ ideal)), if the expert's mode were taken from π instead of the
    ideal law, if an unavailable action counted, or if the cross-entropy
    scored π's argmax instead of the recorded action."""
    ideal = np.array([[[0.6, 0.3, 0.1], [0.0, 0.8, 0.2]]])  # [T=1, N=2, A=3]
    probs = np.array([[[0.2, 0.7, 0.1], [0.0, 0.5, 0.5]]])
    avail = np.array([[[True, True, True], [False, True, True]]])
    actions = np.array([[1, 1]])
    s = law_stats(actions, avail, ideal, probs)
    kl = lambda p, q: sum(a * np.log(a / b) for a, b in zip(p, q) if a > 0)  # noqa: E731
    ent = lambda p: -sum(a * np.log(a) for a in p if a > 0)  # noqa: E731
    assert s["agent_steps"] == 2
    np.testing.assert_allclose(s["recorded_is_expert_mode"], 0.5)  # agent 0's mode is 0
    np.testing.assert_allclose(s["ideal_prob_expert_mode"], (0.6 + 0.8) / 2)
    np.testing.assert_allclose(s["pi_prob_expert_mode"], (0.2 + 0.5) / 2)
    np.testing.assert_allclose(s["pi_argmax_is_expert_mode"], 0.5)
    np.testing.assert_allclose(s["ce_pi"], -(np.log(0.7) + np.log(0.5)) / 2)
    np.testing.assert_allclose(s["ce_ideal"], -(np.log(0.3) + np.log(0.8)) / 2)
    np.testing.assert_allclose(s["entropy_ideal"], (ent(ideal[0, 0]) + ent(ideal[0, 1])) / 2)
    np.testing.assert_allclose(s["entropy_pi"], (ent(probs[0, 0]) + ent(probs[0, 1])) / 2)
    np.testing.assert_allclose(s["kl_ideal_pi"],
                               (kl(ideal[0, 0], probs[0, 0]) + kl(ideal[0, 1], probs[0, 1])) / 2)
    np.testing.assert_allclose(s["mean_available"], 2.5)
