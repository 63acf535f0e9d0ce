"""Shipped recipes (YAML data); see `xlstm-zoo recipes`."""
