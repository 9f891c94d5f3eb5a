"""``fedkit prior pretrain``: self-supervised pre-training of a prior encoder (SimCLR or
MoCo-v2 through ``lightly``) on a public image set; see ``docs/priors.md``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fedkit_core.cli.options import QuietOpt, SetOpt, console, layers_of

if TYPE_CHECKING:
    import torch

prior_app = typer.Typer(
    help="Priors: pre-train a frozen prior encoder for plugins such as Fed-MAS.",
    no_args_is_help=True,
)


@prior_app.command()
def pretrain(
    out: Path = typer.Option(..., "--out", "-o", help="checkpoint file to write (.pt)"),
    data: list[Path] = typer.Option(
        [], "--data", "-d", help="a MedMNIST/segmentation .npz or a folder of images (repeatable)"
    ),
    task: str | None = typer.Option(
        None, "--task", "-t", help="also use this task's pooled training images"
    ),
    set_: list[str] = SetOpt,
    prior: str = typer.Option(
        "cifar-resnet20",
        "--prior",
        help="encoder: cifar-resnet20..110, timm:NAME, torchvision:NAME",
    ),
    method: str = typer.Option("simclr", "--method", help="simclr or moco (MoCo-v2)"),
    epochs: int = typer.Option(20, "--epochs", help="passes over the images"),
    batch_size: int = typer.Option(256, "--batch-size", help="images per step (two views each)"),
    lr: float | None = typer.Option(None, "--lr", help="SGD learning rate (0.06 x batch / 256)"),
    seed: int = typer.Option(0, "--seed", help="random seed"),
    quiet: bool = QuietOpt,
) -> None:
    """Pre-train a prior encoder on public images (not the clients' data) and save it.

    The checkpoint loads with `--set fed-mas.prior=PRIOR --set fed-mas.prior_weights=OUT`.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from fedkit_core.errors import FedkitError
    from fedkit_core.pretrain import PretrainSettings, combine, load_images, save_prior
    from fedkit_core.pretrain import pretrain as run_pretrain
    from fedkit_core.priors import build_encoder

    if not data and not task:
        raise FedkitError("give the images to pre-train on: --data FILE.npz|FOLDER or --task NAME")
    if set_ and not task:
        raise FedkitError("--set configures the task of --task; give --task too")
    try:
        import lightly  # noqa: F401
    except ImportError:
        raise FedkitError(
            "fedkit prior pretrain needs the lightly library: pip install 'fedkit[pretrain]'"
        ) from None
    size = build_encoder(prior)[1]
    parts = [load_images(data, max_side=2 * size)] if data else []
    if task:
        parts.append(_task_images(task, set_))
    images = combine(parts)
    settings = PretrainSettings(prior, method, epochs, batch_size, lr, seed=seed)
    console.print(
        f"pre-training {prior} with {method} on {len(images)} images "
        f"({images.shape[-1]} px, trained at {size} px), {epochs} epochs"
    )
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TimeRemainingColumn(),
        console=console,
        disable=quiet,
    ) as progress:
        bar = progress.add_task("pre-training", total=None)

        def on_step(step: int, total: int, loss: float) -> None:
            progress.update(bar, completed=step, total=total, description=f"loss {loss:.3f}")

        state, info = run_pretrain(images, settings, on_step)
    path = save_prior(out, state, info)
    console.print(
        f"final loss {info['final_loss']:.4f}; wrote {path}\n"
        f"use it: --set fed-mas.prior={prior} --set fed-mas.prior_weights={path}"
    )


def _task_images(task: str, sets: list[str]) -> torch.Tensor:
    """The pooled training images of a task (every client's), as uint8 RGB."""
    from fedkit_core.errors import FedkitError
    from fedkit_core.pretrain import as_uint8_rgb
    from fedkit_core.resolve import resolve_config
    from fedkit_core.tasks.loading import load_task

    cfg, _ = resolve_config(layers_of(None, [], task, sets))
    train = load_task(cfg).pooled("train")
    if train is None or len(train) == 0:
        raise FedkitError(f"the task {task!r} has no training images")
    return as_uint8_rgb(train.images)
