"""Phase 1 of MisoDICE: label unlabeled trajectories from preferences.

* :mod:`jaxil.data.preferences` — query sets (which segment pairs to ask about).
* :mod:`jaxil.algorithms.labelling.oracles` — who answers: ground truth (with label
  noise), a scripted SMAX semantic judge, an external callable (an LLM hook).
* :mod:`jaxil.algorithms.labelling.label` — O-MAPL fit, trajectory scores, top-K labels,
  labelling metrics, the labelled copy.
* :mod:`jaxil.algorithms.labelling.pipeline` — ``jaxil label`` / ``jaxil pipeline``.
"""
