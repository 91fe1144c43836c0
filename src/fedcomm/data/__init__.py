"""Datasets (offline, standard formats), partitioners and the federated view over them."""
