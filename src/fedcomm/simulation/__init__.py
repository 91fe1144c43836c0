"""The round loop, its client data view and checkpoints."""
