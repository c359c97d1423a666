"""An interrupted sweep, for the tests that resume one."""

from __future__ import annotations

import topkbench.api


def interrupt_fits(monkeypatch, max_epochs: int) -> dict:
    """Make ``topkbench.api.fit`` raise KeyboardInterrupt at the ``calls["stop"]``-th fit of
    the protocol (its ``max_epochs``: compile warm-ups pass), counting in ``calls["n"]``;
    returns ``calls`` (``stop`` None: never)."""
    real_fit = topkbench.api.fit
    calls = {"n": 0, "stop": None}

    def flaky_fit(*args, **kwargs):
        if kwargs.get("max_epochs") != max_epochs:
            return real_fit(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == calls["stop"]:
            raise KeyboardInterrupt
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(topkbench.api, "fit", flaky_fit)
    return calls
