"""Partitioning schemes: split a dataset's rows over clients by label, quantity or natural id.

One module per scheme, as in ``flwr_datasets.partitioner``; each holds a :class:`Partitioner`
subclass and the function the registry :data:`PARTITIONERS` finds it by (``partition.kind``
in ``params.yaml``):

======================  ==========================================  ============================
kind                    module                                      class
======================  ==========================================  ============================
``iid``                 :mod:`.iid_partitioner`                     :class:`IidPartitioner`
``dirichlet``           :mod:`.dirichlet_partitioner`               :class:`DirichletPartitioner`
``pathological``        :mod:`.pathological_partitioner`            :class:`PathologicalPartitioner`
``shard``               :mod:`.shard_partitioner`                   :class:`ShardPartitioner`
``lotteryfl``           :mod:`.lotteryfl_partitioner`               :class:`LotteryFLPartitioner`
``size``                :mod:`.size_partitioner`                    :class:`SizePartitioner`
``natural_id``          :mod:`.natural_id_partitioner`              :class:`NaturalIdPartitioner`
``label_cycle``         :mod:`.label_cycle_partitioner`             :class:`LabelCyclePartitioner`
======================  ==========================================  ============================

:mod:`.base` holds what they share (:class:`PartitionError`, :class:`ClientSplits`, the
:class:`Partitioner` base class, the registry), :mod:`._common` the argument checks and
building blocks, :mod:`.split` the per-client :func:`train_test_split`.

Each function is ``fn(labels, *, num_partitions, rng, ...) -> list[np.ndarray]``, returning
one sorted ``int64`` array of row indices per partition (client); it builds the scheme's class
with the same arguments (every argument checked there, before any draw) and returns its
:meth:`~Partitioner.partition`. Randomness comes only from the ``rng`` argument, never from
the global NumPy state. Parameter names and semantics follow ``flwr_datasets.partitioner``
(see each class's docstring for the class it mirrors and any deviation).

Unless a docstring says otherwise every row lands in exactly one partition. ``shuffle``
permutes rows *before* they are dealt out (so which examples of a class go where is random);
flwr shuffles the order inside each partition afterwards, which is moot here because indices
are returned sorted.

``train_test_split`` then splits one client's rows into train and test, stratified by label.
A partitioner that picks each client's test rows itself (``lotteryfl``) returns
:class:`ClientSplits` instead, and no per-client split is made.
"""

from fedcomm.data.partitioners.base import (
    PARTITIONERS,
    ClientSplits,
    Partitioner,
    PartitionError,
    PartitionFn,
    register,
)

# Scheme modules register on import: this order is the order of PARTITIONERS.
# isort: off
from fedcomm.data.partitioners.iid_partitioner import IidPartitioner, iid
from fedcomm.data.partitioners.dirichlet_partitioner import DirichletPartitioner, dirichlet
from fedcomm.data.partitioners.pathological_partitioner import (
    ClassAssignmentMode,
    PathologicalPartitioner,
    pathological,
)
from fedcomm.data.partitioners.shard_partitioner import ShardPartitioner, shard
from fedcomm.data.partitioners.lotteryfl_partitioner import LotteryFLPartitioner, lotteryfl
from fedcomm.data.partitioners.size_partitioner import SizePartitioner, size
from fedcomm.data.partitioners.natural_id_partitioner import NaturalIdPartitioner, natural_id
from fedcomm.data.partitioners.label_cycle_partitioner import LabelCyclePartitioner, label_cycle

# isort: on
from fedcomm.data.partitioners.split import train_test_split

__all__ = [
    "PARTITIONERS",
    "ClassAssignmentMode",
    "ClientSplits",
    "DirichletPartitioner",
    "IidPartitioner",
    "LabelCyclePartitioner",
    "LotteryFLPartitioner",
    "NaturalIdPartitioner",
    "PartitionError",
    "PartitionFn",
    "Partitioner",
    "PathologicalPartitioner",
    "ShardPartitioner",
    "SizePartitioner",
    "dirichlet",
    "iid",
    "label_cycle",
    "lotteryfl",
    "natural_id",
    "pathological",
    "register",
    "shard",
    "size",
    "train_test_split",
]
