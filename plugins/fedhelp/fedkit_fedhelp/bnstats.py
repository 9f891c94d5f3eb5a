"""Public batches must not move the shared backbone's BatchNorm running statistics.

The small model a client uploads serves the private task: its BatchNorm running mean and
variance are what normalise the task's images at test time. FedHelp's regulariser R (eq. 1)
sends *public* images (another data set) through the same backbone during training; in
train mode every such forward pass would blend the public images' statistics into the
running buffers, and the averaged model would carry them into the task's evaluation.

The paper writes R as an extra loss on the same backbone during local training and says
nothing about normalisation, so the public batch is normalised as any training batch is,
with its own batch statistics (train mode), while the running buffers it would update are
throwaway copies: the buffers then average only private task batches, as they would without R.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

#: the buffers of a BatchNorm layer that a train-mode forward pass updates
BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


@contextmanager
def running_stats_kept(module: nn.Module) -> Iterator[None]:
    """Run forward passes inside the block without changing any BatchNorm running buffer of
    ``module``: each buffer is swapped for a copy that the passes update and that is dropped
    on exit (the originals are put back, not overwritten in place, so the autograd graph of
    the passes, which holds the copies, stays valid for the backward pass)."""
    saved = [
        (bn, name, getattr(bn, name))
        for bn in module.modules()
        if isinstance(bn, nn.modules.batchnorm._NormBase)
        for name in BUFFERS
        if getattr(bn, name, None) is not None
    ]
    for bn, name, value in saved:
        setattr(bn, name, value.clone())
    try:
        yield
    finally:
        for bn, name, value in saved:
            setattr(bn, name, value)
