"""Broken on purpose: raises while being imported."""

raise RuntimeError("xlstm-zoo-broken-import fails at import, on purpose")
