"""The round modes and selection rules a run may choose: the built-in ones and those its
plugins register (``fedkit_register_round_modes``, ``fedkit_register_selection_rules``)
and their options (the checks of the choice are :func:`fedkit_core.rules.check_aggregation`)."""

from __future__ import annotations

from collections.abc import Sequence

from fedkit_core.config import Config
from fedkit_core.contract.options import Option
from fedkit_core.engines.asynchronous import ASYNC_OPTIONS, FedAsync, FedBuff
from fedkit_core.engines.rounds import ROUND_OPTIONS, Deadline, RoundMode, Synchronous
from fedkit_core.engines.selection import SELECTION_OPTIONS, cohort_size
from fedkit_core.errors import FedkitError, unknown
from fedkit_core.plugin_manager import PluginSet

#: the built-in round modes by their ``aggregation`` value
BUILTIN_MODES: dict[str, type[RoundMode]] = {
    "sync": Synchronous,
    "deadline": Deadline,
    "fedbuff": FedBuff,
    "fedasync": FedAsync,
}


def round_options() -> list[Option]:
    """The options of how rounds proceed and who trains (declared beside their code)."""
    return [*ROUND_OPTIONS, *ASYNC_OPTIONS, *SELECTION_OPTIONS]


def round_modes(plugins: PluginSet) -> dict[str, type[RoundMode]]:
    """Every round mode by name: the built-in ones and those the run's plugins register."""
    modes = dict(BUILTIN_MODES)

    def register(name: str, mode: type[RoundMode]) -> None:
        if name in modes:
            raise FedkitError(f"round mode {name!r} is registered twice")
        if not (isinstance(mode, type) and issubclass(mode, RoundMode)):
            raise FedkitError(
                f"round mode {name!r} is {mode!r}, not a subclass of fedkit_core.plugin.RoundMode"
            )
        modes[name] = mode

    plugins.hook.fedkit_register_round_modes(register=register)
    return modes


def round_mode(config: Config, plugins: PluginSet, client_ids: Sequence[str]) -> RoundMode:
    """The run's round mode (``aggregation``), made for its clients."""
    mode = mode_class(config, plugins)
    return mode(config, client_ids, cohort_size(len(client_ids), config["sample_fraction"]))


def mode_class(config: Config, plugins: PluginSet) -> type[RoundMode]:
    """The round mode ``aggregation`` names; an unknown name lists the known ones."""
    modes = round_modes(plugins)
    name = config["aggregation"]
    if name not in modes:
        raise unknown("round mode", name, modes)
    return modes[name]
