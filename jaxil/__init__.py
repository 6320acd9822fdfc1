"""jaxil: JAX imitation learning for multi-agent systems."""

__version__ = "0.1.0"
