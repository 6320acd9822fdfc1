"""Phase 1 of MisoDICE: label unlabeled trajectories from preferences.

* :mod:`jaxil.phase1.pairs` — query sets (which segment pairs to ask about).
* :mod:`jaxil.phase1.oracles` — who answers: ground truth (with label
  noise), a scripted SMAX semantic judge, an external callable (an LLM hook).
* :mod:`jaxil.phase1.label` — O-MAPL fit, trajectory scores, top-K labels,
  labelling metrics, the labelled copy.
* :mod:`jaxil.phase1.pipeline` — ``jaxil label`` / ``jaxil pipeline``.
"""
