"""FedCB for fedkit: a frozen classifier from the class-embedding statistics of a text encoder."""

__version__ = "0.1.0"
