"""Foundation-model knowledge on public data: built once before training, then only read.

FedHelp (and any method of its kind) asks M frozen "API" models for a class-probability
vector on every sample (every pixel, for segmentation) of a public data set, once, and
stores the answers in one file that every later run reuses. :func:`build_knowledge` makes
that file; :func:`load_knowledge` reads it back. The file (``.npz``) holds:

============ =================================================================
``images``   (P, H, W, C) uint8: the public images as loaded (any size/channels)
``probs``    classification: (P, M, K) float32, API m's class probabilities for sample p;
             segmentation: (P, M, K, H, W) float16, per pixel (half precision: 900
             images of 64 x 64 px, one binary API, take 15 MB)
``labels``   classification: (P,) int64, the public label of p in the APIs' K classes;
             segmentation: (P, H, W) int16 masks; -1 where unknown
``apis``     (M,) str: the API specs
``classes``  (K,) str: the APIs' class names
============ =================================================================

API specs (``--api``), one per API, for a classification public set:

================================ =========================================================
``cifar-resnet20@FILE`` ..110    a CIFAR-10 ResNet checkpoint (10 classes), e.g. the offline
                                 ones in ``../shared/data/weights/cifar10_resnet/``
``torchvision:<name>@FILE``      a torchvision classifier and its checkpoint
``timm:<name>@FILE``             a timm classifier and its checkpoint
``open_clip:<name>@TAG_OR_FILE`` zero-shot CLIP with the prompts ``a photo of a <class>.``
                                 over the public set's class names
``probe:<source>@FILE``          a frozen pretrained encoder (a prior source of
                                 :mod:`fedkit_priors.encoders`: ``cifar-resnet56``,
                                 ``timm:<name>``, ``torchvision:<name>``, with its
                                 checkpoint) and a linear probe fitted on the public set's
                                 labelled probe split, which is held out from the public
                                 samples: answers in the public set's classes
``probe:model:<name>``           the same on the core model builder's pretrained backbone
                                 (``model=<name>``, ``pretrained=true``)
``precomputed:FILE``             probabilities computed elsewhere: ``.npy`` (P, K) or an
                                 ``.npz`` with ``probs``
================================ =========================================================

The probe APIs are the offline stand-in for the paper's CLIP zero-shot APIs: like them they
answer in the public label space and differ from each other, but they learn that space from
the labelled probe split (by default the public task's ``val`` split; its ``train`` split is
the public set), as the paper's section 4.4 fine-tunes its APIs on part of the medical
public set. :func:`api_agreement` measures each API against the public labels.

and for a segmentation public set (the public images go in as (N, C, H, W) floats in [0, 1]
at the public size; the K per-pixel logits that come out are resized to it):

================================== =======================================================
``torch:FILE``                     a whole frozen segmentation model saved with
                                   ``torch.save(model)`` (unpickling runs the file's code:
                                   only your own files)
``user:package.module:fn@FILE``    ``fn(num_classes=K, in_channels=C)`` with its state dict
                                   ``FILE`` (MedSAM, or any model, wrapped this way)
``otsu``                           the offline stand-in: Otsu's threshold of each image's
                                   luminance, the smaller side foreground, soft
                                   probabilities ``sigmoid(+-(grey - t) / 0.05)``; binary.
                                   A classical method, not a foundation model
``precomputed:FILE``               ``.npy`` (P, K, H, W) or an ``.npz`` with ``probs``
================================== =======================================================
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedkit_core import CIFAR_RESNETS, CifarResNet, FedkitError, load_state_file, require
from fedkit_priors.encoders import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    FrozenEncoder,
    frozen_encoder,
    load_matching,
    open_clip_model,
    open_clip_preprocess,
)

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
API_HELP = (
    "cifar-resnet20@FILE .. cifar-resnet110@FILE, torchvision:<name>@FILE, timm:<name>@FILE, "
    "open_clip:<name>@TAG_OR_FILE, probe:<prior source>@FILE, probe:model:<name> or "
    "precomputed:FILE"
)
#: the inverse L2 strengths a probe API chooses from (by cross-validation on the probe split)
PROBE_CS = (0.001, 0.01, 0.1, 1.0)
SEG_API_HELP = "torch:FILE, user:package.module:factory@FILE, otsu or precomputed:FILE"
#: softness of the ``otsu`` stand-in's probabilities, in grey levels of [0, 1]
OTSU_TEMPERATURE = 0.05


@dataclass
class PublicSet:
    """Public images (N, H, W, C) uint8, their labels (N,) or masks (N, H, W), class names,
    and ``probe``: a labelled split of the same source held out from these samples, on which
    the ``probe:`` APIs fit their linear probes (``None``: none loaded)."""

    images: np.ndarray
    labels: np.ndarray
    classes: list[str]
    probe: PublicSet | None = None

    @property
    def segmentation(self) -> bool:
        return self.labels.ndim == 3


@dataclass
class Knowledge:
    """What :func:`load_knowledge` returns (see the module docstring for the fields)."""

    images: np.ndarray
    probs: np.ndarray
    labels: np.ndarray
    apis: list[str]
    classes: list[str]

    @property
    def num_classes(self) -> int:
        return self.probs.shape[2]

    @property
    def segmentation(self) -> bool:
        return self.probs.ndim == 5


def load_public(
    source: str,
    sets: Sequence[str] = (),
    limit: int | None = None,
    probe_splits: Sequence[str] = ("val",),
) -> PublicSet:
    """The training split of a task (``source`` = task name, ``sets`` its ``key=value``
    options, e.g. ``task.image_size=64``) or of an ``.npz`` file (MedMNIST-style, or
    ``images`` + ``masks`` for segmentation), at most ``limit`` samples (the first).

    ``probe_splits`` (``val``, ``test``) are pooled into ``PublicSet.probe``, the labelled
    data the ``probe:`` APIs fit on: never the training split, whose samples are the public
    set (a task without a val split carves it from train, ``task.val_fraction``)."""
    from fedkit_core import load_task, parse_sets, resolve_config

    values: dict = {"task.name": source}
    if source.endswith(".npz"):
        if not Path(source).is_file():
            raise FedkitError(f"public data {source} does not exist")
        with np.load(source, allow_pickle=False) as f:
            kind = "npz-seg" if "masks" in f.files else "npz"
        values = {"task.name": kind, "task.path": source}
    values.update(parse_sets(list(sets)))
    config, _ = resolve_config(values)
    data = load_task(config)
    split = data.pooled("train")
    images = split.images
    if images.dim() != 4:
        raise FedkitError(f"public data {source!r} must hold 2D images, got {images.dim()}-D")
    count = len(images) if limit is None else min(limit, len(images))
    public = _public_set(images[:count], split.targets[:count], data)
    unknown = sorted(set(probe_splits) - {"val", "test"})
    if unknown:
        raise FedkitError(f"probe splits must be val and/or test, got {unknown}")
    parts = [data.pooled(name) for name in probe_splits]
    parts = [p for p in parts if p is not None]
    if parts and data.kind != "segmentation":
        probe_images = torch.cat([p.images for p in parts])
        public.probe = _public_set(probe_images, torch.cat([p.targets for p in parts]), data)
    return public


def _public_set(images: torch.Tensor, targets: torch.Tensor, data) -> PublicSet:
    if images.dtype != torch.uint8:
        images = (images.clamp(0, 1) * 255).round().to(torch.uint8)
    return PublicSet(
        images.permute(0, 2, 3, 1).contiguous().numpy(),
        targets.numpy().astype(np.int16 if data.kind == "segmentation" else np.int64),
        list(data.class_names),
    )


def build_knowledge(public: PublicSet, apis: Sequence[str], batch_size: int = 128) -> Knowledge:
    """Query every API once on every public sample (on CPU or the first GPU)."""
    if not apis:
        raise FedkitError(
            f"give at least one --api ({SEG_API_HELP if public.segmentation else API_HELP})"
        )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    query = _query_segmentation if public.segmentation else _query
    outs, classes = [], None
    for spec in apis:
        probs, names = query(spec, public, device, batch_size)
        if probs.shape[0] != len(public.images):
            raise FedkitError(
                f"API {spec!r} gave {probs.shape[0]} rows for {len(public.images)} public samples"
            )
        if classes is not None and len(names) != len(classes):
            raise FedkitError(
                f"API {spec!r} has {len(names)} classes, the previous ones {len(classes)}: "
                "all APIs must share one label space"
            )
        classes = classes or names
        outs.append(probs.astype(np.float16 if public.segmentation else np.float32))
    assert classes is not None
    same_space = [c.lower() for c in classes] == [c.lower() for c in public.classes]
    if public.segmentation:  # masks are kept when the class counts agree
        same_space = len(classes) == len(public.classes)
    labels = public.labels if same_space else np.full_like(public.labels, -1)
    return Knowledge(public.images, np.stack(outs, axis=1), labels, list(apis), list(classes))


def save_knowledge(knowledge: Knowledge, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(
        tmp,
        images=knowledge.images,
        probs=knowledge.probs,
        labels=knowledge.labels,
        apis=np.array(knowledge.apis),
        classes=np.array(knowledge.classes),
    )
    tmp.replace(path)


def load_knowledge(path: str | Path) -> Knowledge:
    """Read a knowledge file written by :func:`save_knowledge` (``fedkit knowledge build``)."""
    path = Path(path)
    if not path.is_file():
        raise FedkitError(
            f"knowledge file {path} does not exist; build it with `fedkit knowledge build`"
        )
    with np.load(path, allow_pickle=False) as f:
        missing = {"images", "probs", "labels", "apis", "classes"} - set(f.files)
        if missing:
            raise FedkitError(f"{path} is not a knowledge file (missing {sorted(missing)})")
        probs, labels = f["probs"], f["labels"]
        segmentation = probs.ndim == 5
        k = Knowledge(
            f["images"],
            probs.astype(np.float16 if segmentation else np.float32),
            labels.astype(np.int16 if segmentation else np.int64),
            [str(a) for a in f["apis"]],
            [str(c) for c in f["classes"]],
        )
    if probs.ndim not in (3, 5) or not k.probs.shape[0] == len(k.images) == len(k.labels):
        raise FedkitError(
            f"{path}: probs must be (P, M, K) or, per pixel, (P, M, K, H, W) for the P "
            "public images"
        )
    if segmentation and not k.probs.shape[-2:] == k.images.shape[1:3] == k.labels.shape[1:]:
        raise FedkitError(f"{path}: per-pixel probs, images and masks must share (H, W)")
    return k


def fit_images(
    images: np.ndarray | torch.Tensor, size: Sequence[int], channels: int
) -> torch.Tensor:
    """Public images (N, H, W, C) uint8 as (N, channels, *size) uint8: resized (bilinear,
    antialiased when shrinking) and converted grey <-> RGB (luminance; grey repeated)."""
    x = torch.as_tensor(np.asarray(images))
    if x.dim() == 3:
        x = x.unsqueeze(-1)
    x = x.permute(0, 3, 1, 2).float()
    if x.shape[1] == 3 and channels == 1:
        x = (x * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
    elif x.shape[1] == 1 and channels == 3:
        x = x.expand(-1, 3, -1, -1)
    elif x.shape[1] != channels:
        raise FedkitError(f"cannot convert {x.shape[1]}-channel public images to {channels}")
    size = tuple(int(s) for s in size)
    if tuple(x.shape[-2:]) != size:
        shrink = x.shape[-1] > size[-1]
        x = F.interpolate(x, size=size, mode="bilinear", antialias=shrink, align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8)


# --------------------------------------------------------------------------- APIs


def _query(
    spec: str, public: PublicSet, device: torch.device, batch_size: int
) -> tuple[np.ndarray, list[str]]:
    kind, _, rest = spec.partition(":")
    if kind == "precomputed":
        return _precomputed(rest, public)
    if kind == "probe":
        return _probe(rest, public, device, batch_size), list(public.classes)
    if kind == "open_clip":
        name, _, weights = rest.partition("@")
        net, size, mean, std = _open_clip_zero_shot(name, weights or None, public.classes)
        classes = list(public.classes)
    else:
        net, size, mean, std, classes = _classifier(spec)
    encoder = FrozenEncoder(net, len(classes), size, mean, std, spec).to(device)
    images = torch.from_numpy(public.images).permute(0, 3, 1, 2)
    if images.shape[1] not in (1, 3):
        raise FedkitError(f"API {spec!r} needs grey or RGB public images")
    out = []
    for start in range(0, len(images), batch_size):
        x = images[start : start + batch_size].to(device).float() / 255.0
        out.append(F.softmax(encoder(x), dim=1).cpu())
    return torch.cat(out).numpy(), classes


def _probe(source: str, public: PublicSet, device: torch.device, batch_size: int) -> np.ndarray:
    """``probe:<source>``: a frozen encoder's features and a multinomial logistic regression
    on them (standardised) fitted on the probe split; its class probabilities on every
    public sample."""
    encoder = _probe_encoder(source).to(device)
    probe, k = public.probe, len(public.classes)
    if probe is None or not (probe.labels >= 0).any():
        raise FedkitError(
            f"API 'probe:{source}' fits on a labelled probe split of the public set, and it "
            "has none (the public source's val/test splits)"
        )
    known = probe.labels >= 0
    if len(np.unique(probe.labels[known])) < 2:
        raise FedkitError(f"API 'probe:{source}': the probe split holds fewer than 2 classes")
    clf = fit_probe(_encode(encoder, probe.images, device, batch_size)[known], probe.labels[known])
    seen = clf.predict_proba(_encode(encoder, public.images, device, batch_size))
    probs = np.zeros((len(seen), k), np.float32)  # a class absent from the probe split: 0
    probs[:, clf.classes_] = seen
    return probs


def fit_probe(features: np.ndarray, labels: np.ndarray):
    """A linear probe: standardisation + L2 logistic regression, its inverse strength chosen
    from :data:`PROBE_CS` by the log-loss of a stratified cross-validation (up to 5 folds,
    fewer when a class has fewer samples; the largest C without one)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    def probe(c: float):
        return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=3000))

    folds = int(min(5, np.bincount(labels)[np.unique(labels)].min()))
    best = PROBE_CS[-1]
    if folds >= 2:
        losses = []
        for c in PROBE_CS:
            split = StratifiedKFold(folds).split(features, labels)
            fold_losses = []
            for fit, held in split:
                clf = probe(c).fit(features[fit], labels[fit])
                proba = clf.predict_proba(features[held])
                fold_losses.append(log_loss(labels[held], proba, labels=clf.classes_))
            losses.append(np.mean(fold_losses))
        best = PROBE_CS[int(np.argmin(losses))]
    return probe(best).fit(features, labels)


def _probe_encoder(source: str) -> FrozenEncoder:
    """The frozen encoder of a ``probe:`` API: a prior source with its checkpoint, or the
    core model builder's pretrained backbone (``model:<name>``, at the input size of its
    timm pretrained config, 224 px by default). The builder's backbone normalises images in
    [0, 1] itself, with its pretraining's statistics (0.5 / 0.5 for the EfficientNet-Lites,
    docs/pretrained.md); a backbone without them gets ImageNet's."""
    if source.startswith("model:"):
        from fedkit_core import build_backbone, input_statistics

        name = source[len("model:") :]
        net, dim = build_backbone(name, 3, pretrained=True)
        own = input_statistics(name, True) is not None  # it normalises [0, 1] images itself
        # the timm network (behind the builder's input adapter where there is one)
        cfg = getattr(getattr(net, "net", net), "pretrained_cfg", None) or {}
        size = int(cfg.get("input_size", (3, 224, 224))[-1])
        mean, std = ((0.0,) * 3, (1.0,) * 3) if own else (IMAGENET_MEAN, IMAGENET_STD)
        return FrozenEncoder(net, dim, size, mean, std, f"probe:{source}")
    name, weights = _split_weights(f"probe:{source}")
    return frozen_encoder(name.partition(":")[2], weights)


def _encode(
    encoder: FrozenEncoder, images: np.ndarray, device: torch.device, batch_size: int
) -> np.ndarray:
    """Features (N, D) of (N, H, W, C) uint8 images."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2)
    out = [
        encoder(x[i : i + batch_size].to(device).float() / 255.0).cpu()
        for i in range(0, len(x), batch_size)
    ]
    return torch.cat(out).numpy().astype(np.float64)


def api_agreement(knowledge: Knowledge) -> dict[str, float]:
    """How the APIs of a classification knowledge file answer: per API, the accuracy and
    balanced accuracy of its argmax against the public labels (where known), and for every
    pair the share of public samples on which their argmaxes differ."""
    top = knowledge.probs.argmax(2)  # (P, M)
    known = knowledge.labels >= 0
    out: dict[str, float] = {}
    for m, api in enumerate(knowledge.apis):
        if known.any():
            y, pred = knowledge.labels[known], top[known, m]
            recalls = [(pred[y == c] == c).mean() for c in np.unique(y)]
            out[f"{api} acc"] = float((pred == y).mean())
            out[f"{api} bacc"] = float(np.mean(recalls))
        for n in range(m + 1, len(knowledge.apis)):
            key = f"{api} vs {knowledge.apis[n]} disagree"
            out[key] = float((top[:, m] != top[:, n]).mean())
    return out


def _load_precomputed(path: str) -> tuple[np.ndarray, list[str] | None]:
    """A precomputed API's ``probs`` (an .npy, or an .npz with ``probs`` and optionally
    ``classes``) and its class names when the file has them."""
    file = Path(path)
    if not file.is_file():
        raise FedkitError(f"precomputed API file {path} does not exist")
    if file.suffix != ".npz":
        return np.load(file, allow_pickle=False), None
    with np.load(file, allow_pickle=False) as f:
        if "probs" not in f.files:
            raise FedkitError(f"{path} has no 'probs' array")
        classes = [str(c) for c in f["classes"]] if "classes" in f.files else None
        return f["probs"], classes


def _precomputed(path: str, public: PublicSet) -> tuple[np.ndarray, list[str]]:
    probs, classes = _load_precomputed(path)
    if probs.ndim != 2:
        raise FedkitError(f"{path}: probs must be (P, K), got shape {probs.shape}")
    if np.any(probs < 0) or not np.allclose(probs.sum(1), 1.0, atol=1e-3):
        raise FedkitError(f"{path}: every row of probs must be a probability vector")
    return probs, classes or [f"class{k}" for k in range(probs.shape[1])]


def _split_weights(spec: str) -> tuple[str, str]:
    name, _, weights = spec.partition("@")
    if not weights:
        raise FedkitError(f"API {spec!r} needs its checkpoint: {name}@FILE")
    if not Path(weights).is_file():
        raise FedkitError(f"API {spec!r}: checkpoint {weights} does not exist")
    return name, weights


def _classifier(spec: str) -> tuple[nn.Module, int, tuple, tuple, list[str]]:
    """A classifier with its checkpoint: (net, input side, mean, std, class names)."""
    match = re.fullmatch(r"cifar-(resnet\d+)", spec.partition("@")[0])
    cifar = bool(match) and match.group(1) in CIFAR_RESNETS
    if not cifar and spec.partition(":")[0] not in ("torchvision", "timm"):
        raise FedkitError(f"unknown API {spec!r}: use {API_HELP}")
    name, weights = _split_weights(spec)
    state = load_state_file(weights)
    if cifar:
        net: nn.Module = CifarResNet(CIFAR_RESNETS[match.group(1)], num_classes=10)
        load_matching(net, state, spec)
        return net, 32, IMAGENET_MEAN, IMAGENET_STD, list(CIFAR10_CLASSES)
    kind, _, model = name.partition(":")
    classes = _num_classes(state)
    if kind == "torchvision":
        import torchvision

        try:
            net = torchvision.models.get_model(model, weights=None, num_classes=classes)
        except ValueError as err:
            raise FedkitError(f"API {spec!r}: {err}") from None
        load_matching(net, state, spec)
        return net, 224, IMAGENET_MEAN, IMAGENET_STD, [f"class{k}" for k in range(classes)]
    timm = require("timm", f"API {spec!r}")  # kind == "timm"
    if not timm.is_model(model):
        raise FedkitError(f"API {spec!r}: timm has no model named {model!r}")
    net = timm.create_model(model, pretrained=False, num_classes=classes)
    load_matching(net, state, spec)
    cfg = getattr(net, "pretrained_cfg", {}) or {}
    size = int(cfg.get("input_size", (3, 224, 224))[-1])
    mean, std = cfg.get("mean", IMAGENET_MEAN), cfg.get("std", IMAGENET_STD)
    return net, size, mean, std, [f"class{k}" for k in range(classes)]


def _num_classes(state: dict[str, torch.Tensor]) -> int:
    """The class count of a classifier checkpoint: rows of its last 2-D weight."""
    weights = [v for k, v in state.items() if k.endswith("weight") and v.dim() == 2]
    if not weights:
        raise FedkitError("the checkpoint holds no linear classifier")
    return int(weights[-1].shape[0])


def _open_clip_zero_shot(
    name: str, weights: str | None, classes: Sequence[str]
) -> tuple[nn.Module, int, tuple, tuple]:
    """CLIP's image tower followed by the class-prompt text embeddings (logit scale 100)."""
    open_clip = require("open_clip", "open_clip APIs")
    if name not in open_clip.list_models():
        raise FedkitError(f"open_clip has no model named {name!r}")
    model = open_clip_model(name, weights)
    tokenizer = open_clip.get_tokenizer(name)
    model.eval()
    with torch.no_grad():
        text = model.encode_text(tokenizer([f"a photo of a {c}." for c in classes]))
        text = F.normalize(text.float(), dim=-1)
    tower = model.visual
    size, (mean, std) = open_clip_preprocess(tower)
    return _ZeroShot(tower, text), size, tuple(mean), tuple(std)


class _ZeroShot(nn.Module):
    """Image embedding -> cosine similarity to each class prompt, times CLIP's scale 100."""

    def __init__(self, tower: nn.Module, text: torch.Tensor):
        super().__init__()
        self.tower = tower
        self.register_buffer("text", text)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        image = F.normalize(self.tower(x).float(), dim=-1)
        return 100.0 * image @ self.text.T


# --------------------------------------------------------------------------- segmentation APIs


def _query_segmentation(
    spec: str, public: PublicSet, device: torch.device, batch_size: int
) -> tuple[np.ndarray, list[str]]:
    """Per-pixel class probabilities (P, K, H, W) of one segmentation API."""
    kind, _, rest = spec.partition(":")
    if kind == "precomputed":
        probs = _precomputed_maps(rest, public)
    elif spec == "otsu":
        probs = otsu_probs(public.images)
    else:
        net = _segmenter(spec, public).to(device).eval()
        images = torch.from_numpy(public.images).permute(0, 3, 1, 2)
        out = []
        with torch.no_grad():
            for start in range(0, len(images), batch_size):
                x = images[start : start + batch_size].to(device).float() / 255.0
                logits = net(x)
                if not isinstance(logits, torch.Tensor) or logits.dim() != 4:
                    raise FedkitError(
                        f"API {spec!r} must map (N, C, H, W) images to (N, K, H, W) logits"
                    )
                if logits.shape[-2:] != x.shape[-2:]:
                    logits = F.interpolate(
                        logits, size=x.shape[-2:], mode="bilinear", align_corners=False
                    )
                out.append(F.softmax(logits.float(), dim=1).half().cpu())
        probs = torch.cat(out).numpy()
    k = probs.shape[1]
    names = list(public.classes) if k == len(public.classes) else [f"class{c}" for c in range(k)]
    return probs, names


def _segmenter(spec: str, public: PublicSet) -> nn.Module:
    """A frozen segmentation model: ``torch:FILE`` or ``user:module:factory@FILE``."""
    kind, _, rest = spec.partition(":")
    if kind == "torch":
        if not Path(rest).is_file():
            raise FedkitError(f"API {spec!r}: model file {rest} does not exist")
        net = torch.load(rest, map_location="cpu", weights_only=False)
        if not isinstance(net, nn.Module):
            raise FedkitError(f"API {spec!r}: {rest} holds a {type(net).__name__}, not a model")
        return net
    if kind == "user":
        from fedkit_core import load_factory

        name, weights = _split_weights(rest)
        channels = public.images.shape[-1]
        net = load_factory(name)(num_classes=len(public.classes), in_channels=channels)
        if not isinstance(net, nn.Module):
            raise FedkitError(f"API {spec!r}: the factory returned no torch model")
        load_matching(net, load_state_file(weights), spec)
        return net
    raise FedkitError(f"unknown segmentation API {spec!r}: use {SEG_API_HELP}")


def _precomputed_maps(path: str, public: PublicSet) -> np.ndarray:
    probs, _ = _load_precomputed(path)
    if probs.ndim != 4 or probs.shape[-2:] != public.labels.shape[1:]:
        raise FedkitError(
            f"{path}: per-pixel probs must be (P, K, H, W) at the public size "
            f"{public.labels.shape[1:]}, got shape {probs.shape}"
        )
    if np.any(probs < 0) or not np.allclose(probs.sum(1), 1.0, atol=1e-2):
        raise FedkitError(f"{path}: every pixel of probs must be a probability vector")
    return probs


def otsu_threshold(grey: np.ndarray, bins: int = 256) -> float:
    """Otsu's threshold of values in [0, 1]: the cut maximising the between-class variance."""
    hist, edges = np.histogram(grey, bins=bins, range=(0.0, 1.0))
    centres = (edges[:-1] + edges[1:]) / 2
    w0 = np.cumsum(hist)
    w1 = w0[-1] - w0
    m0 = np.cumsum(hist * centres)
    mean0 = m0 / np.maximum(w0, 1)
    mean1 = (m0[-1] - m0) / np.maximum(w1, 1)
    between = w0 * w1 * (mean0 - mean1) ** 2
    return float(edges[1:][np.argmax(between)])


def otsu_probs(images: np.ndarray) -> np.ndarray:
    """The ``otsu`` stand-in API: (N, H, W, C) uint8 -> (N, 2, H, W) probabilities, the side
    of each image's Otsu threshold with fewer pixels as the foreground (class 1)."""
    x = images.astype(np.float32) / 255.0
    grey = x[..., 0] if x.shape[-1] == 1 else x[..., :3] @ np.array([0.299, 0.587, 0.114])
    out = np.empty((len(grey), 2, *grey.shape[1:]), dtype=np.float32)
    for i, g in enumerate(grey):
        t = otsu_threshold(g)
        sign = 1.0 if (g > t).mean() <= 0.5 else -1.0
        fg = 1.0 / (1.0 + np.exp(-sign * (g - t) / OTSU_TEMPERATURE))
        out[i, 0], out[i, 1] = 1.0 - fg, fg
    return out
