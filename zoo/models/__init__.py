"""Models: causal LM and classifier/tagger heads around a stack."""

from xlstm_zoo.models.classifier import Classifier, ClassifierConfig
from xlstm_zoo.models.lm import CausalLM, CausalLMConfig

__all__ = ["CausalLM", "CausalLMConfig", "Classifier", "ClassifierConfig"]
