"""The frozen-trunk cache: a client's images through the model's frozen trunk, once.

When ``freeze`` covers the stem and first stages of the backbone (:func:`frozen_trunk`),
their output depends only on the image and the frozen weights, which no client changes.
The client then computes it once per image and hands the model these outputs instead of
the images (the backbone's forward pass runs only the rest of the network), every round,
for training and evaluation alike. Each client computes its own from its own data: nothing
about a client's data leaves it. The outputs are recomputed when the frozen entries change
(the first global model of a run whose trunk is not pretrained), which is checked at every
message that loads a model state.

* **Augmentation** (``task.augment``, ``task.transforms``): ``freeze_cache_views``
  augmented views of every training image are computed once (each view's augmentation from
  a stream of its own, seeded by the run's seed and the client); an augmented batch takes
  each sample from one of them, drawn from the round's random stream. Training then sees at
  most that many distinct augmentations of an image instead of a fresh one every epoch.
* **Precision** (``freeze_cache_dtype``): float32 by default, the uncached run's results up
  to the convolutions' summation order; float16 halves the memory and rounds each value
  by at most 2^-11 relative, which the trainable batch norms after the trunk can amplify
  (their running variance, on channels of small spread; measured in docs/pretrained.md).
* **Where** (``freeze_cache``): ``memory`` (each run computes its own), ``disk`` (also
  in ``<user cache>/features``, beside the task cache, and read by later runs of the same
  inputs: the key is a digest of the client's images, the frozen weights and the settings;
  files readable by their owner only), ``off``, ``auto`` (``memory`` unless an active
  plugin does not declare ``fedkit_frozen_cache = True``: a plugin that gives the batch's
  images to anything but the model, such as Fed-MAS's prior encoder, needs the images).

Plugins see the cached outputs where they would see images (``batch.x``,
``client.data``); ``model(batch.x)`` and ``model.backbone(batch.x)`` take them, and images
too (the whole network then runs).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import ClientData, Normalizer, Split
from fedkit_core.devices import autocast_forward, input_layout
from fedkit_core.errors import FedkitError
from fedkit_core.fileio import write_torch
from fedkit_core.hooks.context import derive_seed
from fedkit_core.models.fedmodel import FedModel
from fedkit_core.models.trunk import Trunk, frozen_trunk
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.tasks.cache import user_cache_dir

log = logging.getLogger("fedkit")

AUTO, MEMORY, DISK, OFF = "auto", "memory", "disk", "off"
#: the module attribute by which a plugin says it takes the trunk's outputs as ``batch.x``
DECLARATION = "fedkit_frozen_cache"
#: images through the trunk at once when computing the cache
CHUNK = 256
#: the folder under the user cache holding ``freeze_cache=disk`` entries
FOLDER = "features"
#: a disk entry's format (bump when what an entry holds changes)
FORMAT = 1


def cache_mode(config: Config, plugins: PluginSet) -> str:
    """Where a client of this run caches its trunk's outputs: ``memory``, ``disk`` or
    ``off`` (``freeze_cache=auto``: ``memory`` unless an active plugin does not declare
    :data:`DECLARATION`)."""
    mode = config["freeze_cache"]
    if mode == OFF or not config["freeze"]:
        return OFF
    if mode == AUTO:
        undeclared = [n for n in plugins.active if not _declares(plugins.objects.get(n))]
        return OFF if undeclared else MEMORY
    return mode


def _declares(plugin: Any) -> bool:
    return bool(getattr(plugin, DECLARATION, False))


class TrunkCache:
    """One client's frozen-trunk cache: its data as the model takes them (:meth:`data_for`)."""

    def __init__(self, raw: ClientData, config: Config, device: torch.device, mode: str):
        self.raw = raw
        self.config = config
        self.device = device
        self.mode = mode
        self.dtype = getattr(torch, config["freeze_cache_dtype"])
        self.trunk: Trunk | None = None
        self.snapshot: dict[str, torch.Tensor] | None = None  # the frozen entries cached
        self.cached: ClientData | None = None

    def data_for(self, model: FedModel) -> ClientData:
        """The client's data for ``model``: the trunk's outputs (computed per split when
        first used, anew when the frozen entries differ from those they were computed
        with), or the images when the model has no frozen trunk (an error unless
        ``freeze_cache=auto``)."""
        trunk = frozen_trunk(model)
        if trunk is None:
            if self.config["freeze_cache"] != AUTO:
                raise FedkitError(
                    f"freeze_cache={self.config['freeze_cache']}: the frozen parts (freeze="
                    f"{list(self.config['freeze'])}) are not the input stem and first stages "
                    "of an EfficientNet backbone (conv_stem, bn1, blocks.0 ...), or a model "
                    "extra takes the images; set freeze_cache=off"
                )
            return self.raw
        trunk.attach()
        self.trunk = trunk
        state = trunk.state()
        if self.snapshot is None or not _equal(state, self.snapshot):
            self.snapshot = {k: v.detach().clone() for k, v in state.items()}
            self.cached = self._lazy()
        assert self.cached is not None
        return self.cached

    def _lazy(self) -> ClientData:
        raw = self.raw
        splits = _Lazy(raw.splits, self._split)
        augmented = ["train"] if raw.augment is not None and "train" in raw.splits else []
        views = _Lazy(augmented, self._views)
        return ClientData(raw.id, splits, raw.num_classes, _AS_FLOAT, None, views)

    def _split(self, name: str) -> Split:
        split = self.raw[name]
        if not len(split):
            return split
        return Split(self._stored(name, None, lambda: self._outputs(split, None)), split.targets)

    def _views(self, name: str) -> torch.Tensor:
        split, count = self.raw[name], self.config["freeze_cache_views"]
        return self._stored(
            name, count, lambda: torch.stack([self._outputs(split, v) for v in range(count)])
        )

    def _outputs(self, split: Split, view: int | None) -> torch.Tensor:
        """The trunk's outputs for ``split``'s images (augmented as view ``view``), in the
        cache's precision, where the images are held."""
        assert self.trunk is not None
        raw, cfg = self.raw, self.config
        rng = None
        if view is not None:
            seed = derive_seed(cfg["seed"], "freeze_cache", raw.id, view)
            rng = torch.Generator().manual_seed(seed)
        parts = []
        with torch.no_grad():
            for start in range(0, len(split), CHUNK):
                images = split.images[start : start + CHUNK].to(self.device)
                x = raw.normalizer(images)
                if rng is not None and raw.augment is not None:
                    targets = split.targets[start : start + CHUNK].to(self.device).long()
                    x, _ = raw.augment(x, targets, rng)
                x = input_layout(x, cfg["channels_last"])
                h = autocast_forward(self.trunk, x, cfg["precision"], self.device)
                parts.append(h.to(self.dtype).contiguous().to(split.images.device))
        return torch.cat(parts)

    def _stored(
        self, split: str, views: int | None, compute: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        """``compute()``, or with ``freeze_cache=disk`` its entry in the user cache."""
        if self.mode != DISK:
            return compute()
        path = user_cache_dir() / FOLDER / f"{self._key(split, views)}.pt"
        if path.is_file():
            try:
                return torch.load(path, map_location="cpu", weights_only=True)
            except Exception as err:  # a damaged entry is recomputed, never fatal
                log.warning("ignoring unreadable frozen-trunk cache entry %s: %s", path, err)
        out = compute()
        try:
            write_torch(path, out.cpu(), 0o600)  # derived from a client's private images
        except OSError as err:
            log.warning("could not write the frozen-trunk cache (%s); the next run recomputes", err)
        return out

    def _key(self, split: str, views: int | None) -> str:
        """A digest of everything a split's cached outputs depend on: the images, the
        frozen entries, the trunk, the input's normalisation, the precision, and for
        augmented views the augmentation settings, the seed and the client."""
        assert self.trunk is not None and self.snapshot is not None
        raw, cfg = self.raw, self.config
        adapter = self.trunk.model.backbone.input
        head: dict[str, Any] = {
            "format": FORMAT,
            "net": type(self.trunk.net).__name__,
            "stages": self.trunk.stages,
            "dtype": cfg["freeze_cache_dtype"],
            "precision": cfg["precision"],
            "normalizer": [raw.normalizer.mean, raw.normalizer.std],
            "input": [adapter.in_channels, adapter.rescale, adapter.mean.tolist()],
            "input_std": adapter.std.tolist(),
            "source": None if adapter.source is None else [adapter.source.mean, adapter.source.std],
        }
        if views is not None:
            task = {k: v for k, v in cfg.items() if k.startswith("task.")}
            head.update(views=views, seed=cfg["seed"], client=raw.id, task=task)
        digest = hashlib.sha256(json.dumps(head, sort_keys=True, default=str).encode())
        for name in sorted(self.snapshot):
            digest.update(name.encode())
            digest.update(_bytes(self.snapshot[name]))
        digest.update(split.encode())
        digest.update(_bytes(self.raw[split].images))
        return digest.hexdigest()[:32]


class _Lazy(Mapping[str, Any]):
    """A mapping of ``names`` whose values are made by ``make(name)`` when first read."""

    def __init__(self, names: Iterable[str], make: Callable[[str], Any]):
        self.names = list(names)
        self.make = make
        self.made: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self.made:
            if key not in self.names:
                raise KeyError(key)
            self.made[key] = self.make(key)
        return self.made[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


class _AsFloat(Normalizer):
    """The cached outputs' "normaliser": float32, nothing else (they are the trunk's)."""

    def __init__(self) -> None:
        super().__init__((), ())

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return images.float()

    def invert(self, x: torch.Tensor) -> torch.Tensor:
        raise FedkitError(
            "a plugin undoes the normalisation of batch.x, which holds the frozen trunk's "
            "outputs (freeze_cache); run it with freeze_cache=off"
        )


_AS_FLOAT = _AsFloat()


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].detach(), b[k]) for k in a)


def _bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of ``tensor`` (on the CPU), for a digest."""
    t = tensor.detach().cpu().contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy())
