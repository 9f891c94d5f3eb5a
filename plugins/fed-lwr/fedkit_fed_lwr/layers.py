"""Which modules are Fed-LWR "layers", and which state entries belong to each.

Layers are found and matched by module name, never by position, so the same code serves
any network (a MONAI U-Net, a hand-written U-Net, a timm classifier) and a plugin that
adds modules cannot shift the mapping.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

#: The authors' choice: every Conv, ConvTranspose and BatchNorm module is a layer.
DEFAULT_TYPES = ("Conv", "ConvTranspose", "BatchNorm")


def is_layer(module: nn.Module, types: Sequence[str]) -> bool:
    """Whether ``module`` is of one of ``types``: a class name in its MRO, with or without a
    ``1d``/``2d``/``3d`` suffix (``"Conv"`` matches ``Conv2d`` and its subclasses, not
    ``ConvTranspose2d``; ``"BatchNorm"`` matches ``BatchNorm2d``)."""
    names = {cls.__name__ for cls in type(module).__mro__}
    return any(t in names or any(f"{t}{k}d" in names for k in (1, 2, 3)) for t in types)


def find_layers(
    model: nn.Module, types: Sequence[str], keep: Iterable[str] | None = None
) -> list[str]:
    """Names of the modules of ``model`` that are layers, in registration order.

    With ``keep`` (state-dict keys, e.g. the shared ones), only layers owning at least one
    of those keys are returned: a layer with nothing to aggregate needs no similarity.
    """
    names = [name for name, module in model.named_modules() if name and is_layer(module, types)]
    if keep is None:
        return names
    owned = set(assign(keep, names).values())
    return [name for name in names if name in owned]


def assign(keys: Iterable[str], layers: Iterable[str]) -> dict[str, str | None]:
    """Map each state-dict key to the layer with the longest name that prefixes it
    (``None``: the key belongs to no layer)."""
    layer_set = set(layers)
    out: dict[str, str | None] = {}
    for key in keys:
        parts = key.split(".")
        out[key] = next(
            (
                ".".join(parts[:i])
                for i in range(len(parts) - 1, 0, -1)
                if ".".join(parts[:i]) in layer_set
            ),
            None,
        )
    return out


def deepest_layer(model: nn.Module, x: torch.Tensor, layers: Sequence[str]) -> str:
    """The last layer, in forward order, whose output has the lowest spatial resolution:
    the end of a U-Net's encoder (the layer the paper's ablation v2 uses), the last block
    of a classifier. Runs one eval-mode forward pass of ``x`` (one sample is enough)."""
    wanted = set(layers)
    seen: list[tuple[str, int]] = []
    modules = dict(model.named_modules())

    def record(name: str):
        def hook(_module, _inputs, output):
            if isinstance(output, torch.Tensor) and output.dim() >= 2:
                seen.append((name, output[0, 0].numel()))

        return hook

    handles = [modules[name].register_forward_hook(record(name)) for name in wanted]
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            model(x)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    if not seen:
        raise ValueError("none of the layers ran in the forward pass")
    lowest = min(size for _, size in seen)
    return [name for name, size in seen if size == lowest][-1]
