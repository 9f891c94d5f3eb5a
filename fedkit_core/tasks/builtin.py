"""The tasks that ship with the core. Medical data-set tasks live in their own modules."""

from __future__ import annotations

from fedkit_core.options import Option
from fedkit_core.tasks.base import CLASSIFICATION, SEGMENTATION
from fedkit_core.tasks.npz import CLASSIFICATION_LAYOUT, SEGMENTATION_LAYOUT
from fedkit_core.tasks.registry import SEGMENTATION_DEFAULTS, TaskSpec, register_task

register_task(
    TaskSpec(
        name="synthetic",
        description="built-in multi-site long-tailed classification (28 px RGB, seconds on a CPU)",
        kind=CLASSIFICATION,
        loader="fedkit_core.tasks.synthetic:load",
        options=(
            Option("sites", int, 4, "number of sites (= clients)"),
            Option("num_classes", int, 8, "number of classes"),
            Option("head_samples", int, 150, "training samples of a site's most frequent class"),
            Option("imbalance", float, 15.0, "ratio of the most to the least frequent class"),
        ),
        defaults={"rounds": 20},
    )
)

register_task(
    TaskSpec(
        name="synthetic-seg",
        description="built-in prostate-like 2D segmentation, sites with scanner-like shifts (MONAI)",
        kind=SEGMENTATION,
        loader="fedkit_core.tasks.synthetic_seg:load",
        options=(
            Option("sites", int, 4, "number of sites (= clients)"),
            Option("train_per_site", int, 48, "training images per site"),
        ),
        defaults=SEGMENTATION_DEFAULTS,
    )
)

register_task(
    TaskSpec(
        name="npz",
        description="your classification data in MedMNIST's .npz format (task.path=FILE.npz)",
        kind=CLASSIFICATION,
        loader="fedkit_core.tasks.npz:load_classification",
        needs_path=True,
        layout=CLASSIFICATION_LAYOUT,
    )
)

register_task(
    TaskSpec(
        name="npz-seg",
        description="your segmentation data in one .npz (images, masks, optional site/split)",
        kind=SEGMENTATION,
        loader="fedkit_core.tasks.npz:load_segmentation",
        needs_path=True,
        layout=SEGMENTATION_LAYOUT,
        defaults=SEGMENTATION_DEFAULTS,
    )
)

import fedkit_core.tasks.zoo  # noqa: E402, F401  (registers the medical data-set tasks)
