"""The core plugin: registers every built-in component through the same hook as third parties."""

from __future__ import annotations

from typing import Literal

from xlstm_zoo.config import ZooConfig
from xlstm_zoo.plugins import hookimpl
from xlstm_zoo.registry import tagged_components


class ReferenceBackendConfig(ZooConfig):
    type: Literal["reference"] = "reference"


def _reference_backend(config: ReferenceBackendConfig):
    from xlstm_zoo.backends.reference import reference_backend

    return reference_backend()


class FusedBackendConfig(ZooConfig):
    type: Literal["fused"] = "fused"


def _fused_backend(config: FusedBackendConfig):
    from xlstm_zoo.backends.fused import fused_backend

    return fused_backend()


class CppBackendConfig(ZooConfig):
    type: Literal["cpp"] = "cpp"


def _cpp_backend(config: CppBackendConfig):
    from xlstm_zoo.backends.cpp import cpp_backend

    return cpp_backend()


class TritonBackendConfig(ZooConfig):
    type: Literal["triton"] = "triton"


def _triton_backend(config: TritonBackendConfig):
    from xlstm_zoo.backends.triton import triton_backend

    return triton_backend()


class CudaBackendConfig(ZooConfig):
    type: Literal["cuda"] = "cuda"


def _cuda_backend(config: CudaBackendConfig):
    from xlstm_zoo.backends.cuda import cuda_backend

    return cuda_backend()


@hookimpl
def register_components(register):
    from xlstm_zoo import gates, norms, stacks
    from xlstm_zoo.blocks import mlstm_7b, plain, post_up, pre_up, residual
    from xlstm_zoo.cells import lstm, mlstm, slstm
    from xlstm_zoo.models import classifier, lm
    from xlstm_zoo.tasks import formal_cf, formal_cs, formal_regular, retrieval, text

    for module in (lstm, slstm, mlstm, gates, norms, plain, residual, pre_up, post_up, mlstm_7b, stacks, lm, classifier,
                   formal_regular, formal_cf, formal_cs, retrieval, text):
        for builder in tagged_components(module):
            register(builder)
    register(kind="backend", name="reference", config=ReferenceBackendConfig, builder=_reference_backend,
             description="pure PyTorch: differentiable, any device, the ground truth for every other backend")
    register(kind="backend", name="fused", config=FusedBackendConfig, builder=_fused_backend,
             description="pure PyTorch sLSTM/LSTM loops with hand-written backward passes: any device, fast on CPU")
    register(kind="backend", name="cpp", config=CppBackendConfig, builder=_cpp_backend,
             description="sLSTM forward loop compiled from C++ on first use (CPU; falls back if the build fails)")
    register(kind="backend", name="triton", config=TritonBackendConfig, builder=_triton_backend,
             description="Triton kernels on CUDA GPUs: mLSTM chunkwise and step, sLSTM forward and backward")
    register(kind="backend", name="cuda", config=CudaBackendConfig, builder=_cuda_backend,
             description="CUDA sLSTM kernel compiled just in time with nvcc (falls back if the build fails)")
