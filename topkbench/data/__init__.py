"""Datasets: generators, loaders and the registry."""
