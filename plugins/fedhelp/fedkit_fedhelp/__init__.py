"""FedHelp (Wang and Lyu, 2024) as a fedkit plugin: see :mod:`fedkit_fedhelp.plugin`."""

__version__ = "0.2.0"
