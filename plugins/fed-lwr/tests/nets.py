"""Small networks for the tests: a classic U-Net in the style of the authors' code."""

from __future__ import annotations

import torch
from torch import nn


def double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),  # in place: what a hook saw must not change afterwards
        nn.Conv2d(cout, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class ClassicUNet(nn.Module):
    """Ronneberger's U-Net shape with two levels: conv-BN-ReLU blocks, max-pool down,
    ConvTranspose up, skip concatenation."""

    def __init__(self, cin: int = 1, classes: int = 2, width: int = 4):
        super().__init__()
        self.enc1 = double_conv(cin, width)
        self.enc2 = double_conv(width, 2 * width)
        self.pool = nn.MaxPool2d(2)
        self.bottleneck = double_conv(2 * width, 4 * width)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = double_conv(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = double_conv(2 * width, width)
        self.out = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        b = self.bottleneck(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(b), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.out(d1)
