"""ONNX and TensorRT export of step models (token and states in, output and states out).

Reserved namespace: the exporters arrive with the export issue; nothing is exported yet.
"""
