"""The ``fedkit prior`` and ``fedkit knowledge`` commands, which this package adds to
``fedkit`` through the ``fedkit_register_commands`` hook.

``fedkit prior pretrain``: self-supervised pre-training of a prior encoder (SimCLR or MoCo-v2
through ``lightly``) on a public image set; see ``docs/priors.md``.
``fedkit knowledge build``: query foundation-model APIs once on a public data set; the file
it writes (see :mod:`fedkit_priors.knowledge`) is what FedHelp's ``fedhelp.knowledge`` reads,
and the APIs are never called again during training.

Only ``typer`` and ``rich`` are imported here: the work happens in the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from fedkit_core import FedkitError, hookimpl

if TYPE_CHECKING:
    import torch

console = Console()
SetOpt = typer.Option([], "--set", "-s", help="override a config key: key=value (repeatable)")
QuietOpt = typer.Option(False, "--quiet", "-q", help="no progress display")

prior_app = typer.Typer(
    help="Priors: pre-train a frozen prior encoder for plugins such as Fed-MAS.",
    no_args_is_help=True,
)
knowledge_app = typer.Typer(
    help="Foundation-model knowledge on public data, built once (FedHelp).",
    no_args_is_help=True,
)


@hookimpl
def fedkit_register_commands(cli: Any) -> None:
    """Add ``fedkit prior`` and ``fedkit knowledge`` to the ``fedkit`` command."""
    cli.add_typer(knowledge_app, name="knowledge")
    cli.add_typer(prior_app, name="prior")


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

    from fedkit_priors.encoders import build_encoder
    from fedkit_priors.pretrain import PretrainSettings, combine, load_images, save_prior
    from fedkit_priors.pretrain import pretrain as run_pretrain

    if not data and not task:
        raise FedkitError("give the images to pre-train on: --data FILE.npz|FOLDER or --task NAME")
    if set_ and not task:
        raise FedkitError("--set configures the task of --task; give --task too")
    try:
        import lightly  # noqa: F401
    except ImportError:
        raise FedkitError(
            "fedkit prior pretrain needs the lightly library: pip install 'fedkit-priors[pretrain]'"
            " (from a fedkit checkout: pip install -e 'plugins/priors[pretrain]')"
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
    from fedkit_core import load_task, parse_sets, resolve_config
    from fedkit_priors.pretrain import as_uint8_rgb

    cfg, _ = resolve_config([{"task.name": task}, parse_sets(sets)])
    train = load_task(cfg).pooled("train")
    if train is None or len(train) == 0:
        raise FedkitError(f"the task {task!r} has no training images")
    return as_uint8_rgb(train.images)


@knowledge_app.command()
def build(
    public: str = typer.Option(
        ...,
        "--public",
        help="public data: a task name (with --set task.*=...) or an .npz file (with masks: "
        "segmentation; --set task.image_size=N stores it at N px)",
    ),
    api: list[str] = typer.Option(
        ...,
        "--api",
        help="an API (repeatable): cifar-resnet20@FILE, torchvision:NAME@FILE, "
        "timm:NAME@FILE, open_clip:NAME@TAG_OR_FILE, probe:SOURCE@FILE (a frozen encoder "
        "with a linear probe fitted on --probe-split), probe:model:NAME, precomputed:FILE; "
        "for a segmentation "
        "public set: torch:FILE, user:MODULE:FACTORY@FILE, otsu (offline stand-in), "
        "precomputed:FILE",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="the knowledge file to write (.npz)"),
    set_: list[str] = SetOpt,
    limit: int | None = typer.Option(None, "--limit", help="use the first N public samples"),
    probe_split: list[str] = typer.Option(
        ["val"],
        "--probe-split",
        help="the public source's labelled split(s) the probe: APIs fit on (val, test; "
        "repeatable); held out from the public samples, which are its train split",
    ),
) -> None:
    """Ask every API for class probabilities on every public sample; write them to --out."""
    from fedkit_priors.knowledge import api_agreement, build_knowledge, load_public, save_knowledge

    data = load_public(public, set_, limit, probe_split)
    knowledge = build_knowledge(data, api)
    save_knowledge(knowledge, out)
    if knowledge.segmentation:
        height, width = knowledge.probs.shape[-2:]
        masked = int((knowledge.labels >= 0).any(axis=(1, 2)).sum())
        console.print(
            f"{out}: {len(knowledge.images)} public images x {len(api)} APIs x "
            f"{knowledge.num_classes} classes per pixel ({height} x {width}; {masked} with "
            "masks in the APIs' classes)"
        )
        return
    labelled = int((knowledge.labels >= 0).sum())
    console.print(
        f"{out}: {len(knowledge.images)} public samples x {len(api)} APIs x "
        f"{knowledge.num_classes} classes ({labelled} with labels in the APIs' classes)"
    )
    for name, value in api_agreement(knowledge).items():
        console.print(f"  {name}: {value:.3f}", highlight=False)
