"""A federation before its first round: the task's data split into clients, described.

Every engine starts from here (the local engine in one process; each Flower node for its
own client), so data loading, partitioning and the device are the same on all. Shot groups
from ``task.shot_thresholds`` are derived by the server from the class counts clients send
at setup (:func:`fedkit_core.engines.server.shot_groups`), as in a deployment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import ClientData, ClientInfo, TaskInfo
from fedkit_core.devices import DataPlacement
from fedkit_core.errors import FedkitError
from fedkit_core.partitions import partition
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.tasks.loading import load_task


def pick_device(name: str) -> torch.device:
    """The torch device for ``device=name`` (``auto``: the GPU when there is one).

    On a GPU, cuDNN is set to deterministic algorithms, in every engine's server and clients
    alike, so that a seed gives the same run.
    """
    if name == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(name)
        except RuntimeError as err:
            raise FedkitError(f"device={name!r} is not a torch device: {err}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise FedkitError("device=cuda was asked for but no CUDA GPU is available")
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    return device


@dataclass
class Federation:
    """Everything a run needs before its first round: config, plugins, data, clients."""

    config: Config
    plugins: PluginSet
    task: TaskInfo
    clients: dict[str, ClientData]
    device: torch.device
    #: the device copies of the clients' data this process holds (``data_on_device``)
    placement: DataPlacement = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.placement = DataPlacement(self.device, self.config["data_on_device"])

    def client_data(self, client_id: str) -> ClientData:
        """The data a client of this process trains on: on the GPU when ``data_on_device``
        puts it there (placed when first asked, one device copy shared by the clients),
        else the host data of :attr:`clients`."""
        return self.placement.place(self.clients[client_id])

    @property
    def infos(self) -> dict[str, ClientInfo]:
        """Every client's own statistics, as only a simulation holding all the data has them."""
        return {cid: data.info() for cid, data in self.clients.items()}


def prepare(config: Config, plugins: PluginSet) -> Federation:
    """Load and partition the task's data and describe it."""
    data = load_task(config)
    clients = partition(data, config)
    wanted = config["min_clients"]
    if wanted is not None and wanted > len(clients):  # no round could ever have them
        raise FedkitError(
            f"min_clients is {wanted} but the federation has {len(clients)} clients; "
            "set it to at most that (or leave it unset: all sampled clients)"
        )
    sample = data.sample_split().images
    task = TaskInfo(
        name=config["task.name"],
        kind=data.kind,
        class_names=list(data.class_names),
        in_channels=int(sample.shape[1]),
        image_shape=tuple(int(s) for s in next(iter(clients.values()))["train"].images.shape[2:]),
        client_ids=list(clients),
        shot_groups=data.shot_groups,
    )
    return Federation(config, plugins, task, clients, pick_device(config["device"]))
