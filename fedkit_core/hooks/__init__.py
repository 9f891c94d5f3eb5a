"""The contract between the core and its plugins, on top of its vocabulary
(:mod:`fedkit_core.contract`) and a run's keys (:mod:`fedkit_core.config`).

* :mod:`~fedkit_core.hooks.hookspecs`: every hook, documented (like pytest's hookspec.py)
* :mod:`~fedkit_core.hooks.context`: what hooks see, a client's and the server's context

Plugins import its public names from :mod:`fedkit_core.plugin`.
"""
