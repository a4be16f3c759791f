"""kube: Railyard's own thin Kubernetes API client (decision 0071) — configuration, a
client-side rate limit, the few verbs the services use, one reflector, and NodeTopology
publication. An adapter: it imports the pure core and records, nothing above."""
