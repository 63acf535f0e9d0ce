"""Loggers: components of kind ``logger`` that receive a run's metrics besides metrics.jsonl
(TensorBoard, MLflow, W&B built in; a plugin adds others the same way), chosen with
``train.report_to``."""
