"""How much does a frozen prior know about a data set? A linear probe and a spread measure.

Fed-MAS pulls the local model's projection towards the prior's feature and weighs clients by
per-class distances to it, so it can only help when the prior's features separate the
classes. For a MedMNIST-format file this prints, for the prior with its weights, the same
architecture with random weights, and raw pixels: the balanced accuracy of a class-balanced
logistic regression trained on the train split and scored on the test split, and the mean
cosine between features of different images (near 1: the prior maps every image alike).

    OMP_NUM_THREADS=1 python benchmarks/prior_probe.py \
        --data ../shared/data/medmnist/retinamnist.npz \
        --prior cifar-resnet20 --weights ../shared/data/weights/cifar10_resnet/resnet20-12fca82f.th

``--weights`` takes several checkpoints (e.g. priors pre-trained with different seeds) and
``--random-seeds 0,1,2`` as many random-weight rows; groups of more than one print mean ± std.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score
from sklearn.preprocessing import StandardScaler

from fedkit_core.priors import frozen_encoder


def load(path: str, split: str) -> tuple[torch.Tensor, np.ndarray]:
    with np.load(path) as npz:
        images, labels = npz[f"{split}_images"], npz[f"{split}_labels"].reshape(-1)
    x = torch.from_numpy(images).float() / 255
    x = x[:, None] if x.dim() == 3 else x.permute(0, 3, 1, 2)
    return x, labels


def features(encoder, images: torch.Tensor, batch: int = 256) -> np.ndarray:
    return torch.cat([encoder(images[i : i + batch]) for i in range(0, len(images), batch)]).numpy()


def probe(train: np.ndarray, y_train, test: np.ndarray, y_test) -> float:
    scaler = StandardScaler().fit(train)
    clf = LogisticRegression(max_iter=2000, class_weight="balanced", C=1.0)
    clf.fit(scaler.transform(train), y_train)
    return float(balanced_accuracy_score(y_test, clf.predict(scaler.transform(test))))


def mean_cosine(feats: np.ndarray, n: int = 500) -> float:
    f = feats[:n] / np.linalg.norm(feats[:n], axis=1, keepdims=True).clip(1e-12)
    sims = f @ f.T
    return float((sims.sum() - np.trace(sims)) / (len(f) * (len(f) - 1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--prior", default="cifar-resnet20")
    parser.add_argument(
        "--weights", required=True, nargs="+", help="one or more checkpoints (e.g. one per seed)"
    )
    parser.add_argument(
        "--random-seeds", default="0", help="seeds of the random-weight rows (comma-separated)"
    )
    args = parser.parse_args()
    x_train, y_train = load(args.data, "train")
    x_test, y_test = load(args.data, "test")
    groups: dict[str, list[float]] = {"pretrained": [], "random": []}
    print(f"{'features':<48} {'dim':>5} {'probe bACC':>11} {'mean cos':>9}")

    def row(name: str, encoder, group: str) -> None:
        train, test = features(encoder, x_train), features(encoder, x_test)
        score = probe(train, y_train, test, y_test)
        groups[group].append(score)
        print(f"{name:<48} {train.shape[1]:>5} {score:>11.4f} {mean_cosine(train):>9.4f}")

    for weights in args.weights:
        row(f"{args.prior} {Path(weights).name}", frozen_encoder(args.prior, weights), "pretrained")
    for seed in [int(s) for s in args.random_seeds.split(",")]:
        torch.manual_seed(seed)
        row(f"{args.prior} (random, seed {seed})", frozen_encoder(args.prior), "random")
    train, test = x_train.flatten(1).numpy(), x_test.flatten(1).numpy()
    score = probe(train, y_train, test, y_test)
    print(f"{'raw pixels':<48} {train.shape[1]:>5} {score:>11.4f} {mean_cosine(train):>9.4f}")
    for group, scores in groups.items():
        if len(scores) > 1:
            print(
                f"{group}: probe bACC {np.mean(scores):.4f} ± {np.std(scores, ddof=1):.4f} "
                f"over {len(scores)}"
            )


if __name__ == "__main__":
    main()
