"""CUDA sLSTM kernel, compiled just in time (placeholder until the kernel lands)."""

from xlstm_zoo.backends.dispatch import Backend


class CudaBackend(Backend):
    def unavailable_reason(self):
        return "not built yet"


def cuda_backend() -> Backend:
    return CudaBackend(name="cuda", priority=30, description="CUDA sLSTM (JIT)", ops={})
