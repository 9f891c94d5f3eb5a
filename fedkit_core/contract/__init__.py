"""The vocabulary of the contract between the core and its plugins: what the hooks
(:mod:`fedkit_core.hooks`) speak in.

* :mod:`~fedkit_core.contract.messages`: the wire format, named arrays and plain scalars
* :mod:`~fedkit_core.contract.options`: typed config options, declared alike by the core,
  tasks and plugins
* :mod:`~fedkit_core.contract.data`: the data a task hands over (splits, batches, task and
  client descriptions)
* :mod:`~fedkit_core.contract.channels`: what a run sends beyond the model update, and
  whether a private run may send it

It depends on nothing in ``engines/`` or ``results/`` (``tests/test_layers.py``). Plugins
import its public names from :mod:`fedkit_core.plugin`.
"""
