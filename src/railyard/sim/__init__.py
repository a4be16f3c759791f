"""`railyard simulate`: the extender's ClusterState and allocator against baseline policies,
over a simulated cluster and a workload trace (`docs/simulator.md`).

trace → arrivals (with derived RDMA demand) → run (policies on ledgers) → metrics → report.
"""
