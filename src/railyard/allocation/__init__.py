"""The joint allocator's domain: requests, the node ledger, allocations, node scores."""

from railyard.allocation.ledger import Ledger, LedgerConflict
from railyard.allocation.names import (
    ALLOCATION_ANNOTATION,
    DEFAULT_RESOURCES,
    REQUEST_ANNOTATION,
    ResourceNames,
)
from railyard.allocation.request import Request, RequestError, parse_request_spec, request_from_pod
from railyard.allocation.types import Allocation, GpuRef, Infeasible, NicRef, Pair

__all__ = [
    "ALLOCATION_ANNOTATION",
    "DEFAULT_RESOURCES",
    "REQUEST_ANNOTATION",
    "Allocation",
    "GpuRef",
    "Infeasible",
    "Ledger",
    "LedgerConflict",
    "NicRef",
    "Pair",
    "Request",
    "RequestError",
    "ResourceNames",
    "parse_request_spec",
    "request_from_pod",
]
