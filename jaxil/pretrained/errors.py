"""The one exception the checkpoint readers raise."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as the model it claims to be.

    The message is one line that names the problem (the tensor, the shape,
    the file, the key) and what to do about it, so the command line can
    print it as it is, without a traceback.
    """
