"""Datasets (offline, standard formats), partitioners and the federated view over them.

- :mod:`fedcomm.data.types`: the in-memory :class:`~fedcomm.data.types.Dataset`;
- :mod:`fedcomm.data.datasets`: one loader module per dataset or format family, their registry
  and the shared checks of dataset files;
- :mod:`fedcomm.data.partitioners`: one module per partitioning scheme, and their registry;
- :mod:`fedcomm.data.federated`: a partition (spec, content hash, per-client rows), built from a
  dataset; :mod:`fedcomm.data.partition_files`: a partition on disk.
"""
