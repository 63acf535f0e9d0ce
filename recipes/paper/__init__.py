"""Recipes that reproduce the paper's experiments (YAML data)."""
