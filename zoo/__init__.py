"""xlstm-zoo: a modular, composable layer zoo for the xLSTM family of recurrent models."""

__version__ = "0.1.0"
