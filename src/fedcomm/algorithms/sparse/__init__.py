"""The sparse-mask family's shared pieces: FedDST, RandomMask, GraSP and PruneFL each build on
them with a config and a mask rule of their own.

* :mod:`.family`: the config the fixed- and dynamic-mask algorithms share (:class:`SparseConfig`),
  the model check (:func:`layers_of`) and how far a readjustment moved the mask (:func:`churn`);
* :mod:`.masks`: maskable layers, magnitude pruning, ``θ ⊙ m``, FedDST's sparse averaging,
  counts and digests of a mask set;
* :mod:`.budgets`: the weights each layer keeps at a target sparsity (the FedDST code's rule,
  RigL's ERK, uniform);
* :mod:`.codec`: masked weights and their masks as payload entries, and what the masks cost.

It imports no algorithm and no paper package. This package re-exports :mod:`.family`'s names.
"""

from __future__ import annotations

from fedcomm.algorithms.sparse.family import SparseConfig, churn, layers_of, validate_model

__all__ = ["SparseConfig", "churn", "layers_of", "validate_model"]
