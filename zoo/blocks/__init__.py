"""Blocks: wrappers that turn a cell into a residual layer (plain, residual, pre_up, post_up, mlstm_7b)."""

from xlstm_zoo.blocks.base import Block, ConvBlockState
from xlstm_zoo.blocks.mlstm_7b import MLSTM7BBlock, MLSTM7BBlockConfig
from xlstm_zoo.blocks.plain import PlainBlock, PlainBlockConfig
from xlstm_zoo.blocks.post_up import PostUpBlock, PostUpBlockConfig
from xlstm_zoo.blocks.pre_up import PreUpBlock, PreUpBlockConfig
from xlstm_zoo.blocks.residual import ResidualBlock, ResidualBlockConfig

__all__ = [
    "Block", "ConvBlockState", "MLSTM7BBlock", "MLSTM7BBlockConfig", "PlainBlock", "PlainBlockConfig",
    "PostUpBlock", "PostUpBlockConfig", "PreUpBlock", "PreUpBlockConfig", "ResidualBlock", "ResidualBlockConfig",
]
