"""Phase 1 of MisoDICE: label unlabeled trajectories from preferences.

* [`jaxil.data.preferences`][jaxil.data.preferences] — query sets (which
  segment pairs to ask about).
* [`jaxil.algorithms.labelling.oracles`][jaxil.algorithms.labelling.oracles] —
  who answers: ground truth (with label noise), a scripted SMAX semantic judge,
  an external callable (an LLM hook).
* [`jaxil.algorithms.labelling.label`][jaxil.algorithms.labelling.label] —
  O-MAPL fit, trajectory scores, top-K labels, labelling metrics, the labelled
  copy.
* [`jaxil.algorithms.labelling.pipeline`][jaxil.algorithms.labelling.pipeline]
  — `jaxil label` / `jaxil pipeline`.
"""
