"""A user model for ``model: mymodel:make`` (see fedkit_core/models/user.py).

fedkit calls ``make(num_classes=..., in_channels=...)`` and takes the last ``nn.Linear``
as the head, the rest as the backbone; no fedkit import is needed.
"""

from torch import nn


def make(num_classes: int, in_channels: int) -> nn.Module:
    """Two conv-BN-ReLU stages, global pooling and a linear classifier."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, num_classes),
    )
