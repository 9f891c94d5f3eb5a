"""FCA (Wicaksana et al., IEEE TMI 2023): federated classifier anchoring for fedkit.

The hooks live in :mod:`fedkit_fca.plugin`; the loss terms in :mod:`fedkit_fca.losses`;
the generalisation/specialisation table of a ``fedkit compare`` in :mod:`fedkit_fca.gs`.
"""

__version__ = "0.1.0"
