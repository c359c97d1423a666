"""The losses: the method registry and loss ids (no numba), and one numba module per loss
family (value, conjugate and SDCA block update side by side), joined by the one switch on the
loss ids in :mod:`topkbench.losses.dispatch`."""
