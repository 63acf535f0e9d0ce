"""An offline lm-evaluation-harness task (--include_path this folder; docs/transformers.md)."""
