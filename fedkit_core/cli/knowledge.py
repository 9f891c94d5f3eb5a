"""``fedkit knowledge build``: query foundation-model APIs once on a public data set.

The file it writes (see :mod:`fedkit_core.knowledge`) is what FedHelp's ``fedhelp.knowledge``
reads; the APIs are never called again during training.
"""

from __future__ import annotations

from pathlib import Path

import typer

from fedkit_core.cli.options import SetOpt, console

knowledge_app = typer.Typer(
    help="Foundation-model knowledge on public data, built once (FedHelp).",
    no_args_is_help=True,
)


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
    from fedkit_core.knowledge import api_agreement, build_knowledge, load_public, save_knowledge

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
