"""Railyard: RDMA NICs paired with GPUs on Kubernetes."""

__version__ = "0.1.0"
