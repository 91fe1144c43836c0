"""Simulated time: client links, compute, availability and the round clock."""
