"""Shipped model recipes (YAML data)."""
