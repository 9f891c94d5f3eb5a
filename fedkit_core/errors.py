"""Errors fedkit reports to users.

A :class:`FedkitError` is a problem with the user's input (an unknown plugin, a bad
config value, missing data, a diverging loss...). The CLI prints its message and exits
with code 2, without a traceback unless ``--debug`` is given. Anything else that escapes
is a bug and is reported as such.
"""

from __future__ import annotations

import difflib
import errno
import os
from collections.abc import Iterable


class FedkitError(Exception):
    """A user-facing error: the message alone must tell the user what to change."""

    exit_code = 2


class NoSpace(FedkitError):
    """The disk (or the user's quota) is full: the machine's problem, neither the input's
    nor a bug. What was written before is intact (every file is written whole or not at
    all), so the run continues with ``fedkit resume`` once there is space."""


#: the ``errno`` of a write that found no space
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def no_space(err: BaseException) -> BaseException:
    """``err`` as a :class:`NoSpace` when it is a write that found the disk full, else
    ``err`` itself (a client's failure: reported the same way on every engine)."""
    if isinstance(err, OSError) and not isinstance(err, FedkitError) and err.errno in DISK_FULL:
        where = f" writing {err.filename}" if err.filename else ""
        return NoSpace(f"no space left on the device{where} ({err.strerror})")
    return err


#: the modules of the plugins registered in this process -> the plugin's name, so that an
#: error raised in a plugin's code names the plugin (filled by ``PluginSet``)
PLUGIN_MODULES: dict[str, str] = {}


def plugin_of(err: BaseException) -> str | None:
    """The name of the registered plugin whose code raised ``err`` (the innermost frame of
    its traceback that lies in a plugin's module), ``None`` when none did."""
    tb, found = err.__traceback__, None
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        owners = [p for p in PLUGIN_MODULES if module == p or module.startswith(p + ".")]
        if owners:  # the closest: a plugin's own module before a package several share
            found = PLUGIN_MODULES[max(owners, key=len)] or found
        tb = tb.tb_next
    return found


def failure_text(err: BaseException) -> str:
    """How a client's failure reads in its failed reply and the round's event: a user error's
    own message, ``the client exited (N)`` for ``sys.exit``, else the exception's kind and
    text, after the plugin that raised it (``plugin 'fca' raised KeyError: ...``). The same
    on every engine."""
    if isinstance(err, SystemExit):
        return f"the client exited ({err})"
    if isinstance(err, FedkitError):
        return str(err)
    plugin = plugin_of(err)
    where = f"plugin {plugin!r} raised " if plugin else ""
    return f"{where}{type(err).__name__}: {err}"


def debug_hint(text: str) -> str:
    """``text`` (what to do about a bug) with the hint to rerun with ``--debug`` for the
    traceback, left out when this run has ``--debug`` (it shows the traceback)."""
    if os.environ.get("FEDKIT_DEBUG"):
        return f"{text}."
    return f"{text}; rerun with --debug for the traceback."


class ClientFailure(FedkitError):
    """A client could not complete its part of a round.

    ``bug=True`` (the client raised something other than a :class:`FedkitError`: a fault in
    a plugin or in fedkit, not in the user's input) makes it exit code 1, with a hint to
    rerun with ``--debug`` for the traceback.
    """

    def __init__(self, client_id: str, round: int, message: str, bug: bool = False):
        hint = "\n" + debug_hint("This is a bug in a plugin or in fedkit") if bug else ""
        super().__init__(f"client {client_id!r} failed in round {round}: {message}{hint}")
        self.client_id = client_id
        self.round = round
        self.reason = message
        self.exit_code = 1 if bug else 2


#: names other tools use for a config key, suggested when a user writes them
SYNONYMS = {
    "learning_rate": "lr",
    "epochs": "local_epochs",
    "local_steps": "local_epochs",
    "num_rounds": "rounds",
    "num_clients": "clients",
    "n_clients": "clients",
    "batchsize": "batch_size",
    "wd": "weight_decay",
    "fraction_fit": "sample_fraction",
    "dirichlet_alpha": "partition.alpha",
}


def unknown(kind: str, name: str, valid: Iterable[str]) -> FedkitError:
    """An error for an unknown name, with close matches (and the usual other spelling of a
    config key, ``learning_rate`` for ``lr``) and the list of valid ones."""
    valid = sorted(valid)
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6) if len(name) < 100 else []
    synonym = SYNONYMS.get(name.lower())
    if synonym is None:  # a typo of another tool's name: lerning_rate -> learning_rate -> lr
        typo = difflib.get_close_matches(name.lower(), list(SYNONYMS), n=1, cutoff=0.8)
        synonym = SYNONYMS[typo[0]] if typo else None
    if synonym in valid and synonym not in close:
        close.insert(0, synonym)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    listing = ", ".join(valid) if valid else "(none)"
    shown = repr(name if len(name) <= 80 else name[:80] + "...")
    return FedkitError(f"unknown {kind} {shown}.{hint} Valid {kind}s: {listing}")
