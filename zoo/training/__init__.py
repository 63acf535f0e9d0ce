"""Training: the trainer, its config and learning-rate schedule."""
