"""Ablation grids: expansion into cells, the resumable runner, and reports."""
