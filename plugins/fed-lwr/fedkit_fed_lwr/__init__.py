"""Fed-LWR for fedkit: layer-wise CKA re-weighting for performance fairness (Yan et al. 2024).

The hooks are in :mod:`fedkit_fed_lwr.plugin`; the CKA estimator in :mod:`.cka`, the layer
mapping in :mod:`.layers`, the client-side measurement in :mod:`.similarity` and the
server-side weighting in :mod:`.weights`.
"""

__version__ = "0.1.0"
