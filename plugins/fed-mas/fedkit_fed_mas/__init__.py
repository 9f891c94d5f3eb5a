"""Fed-MAS for fedkit: federated aggregation weighted by self-supervised priors."""

__version__ = "0.1.0"
