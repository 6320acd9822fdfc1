"""Interactive imitation: DAgger, On-policy Expert Corrections, on-policy
rejection sampling."""
