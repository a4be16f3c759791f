"""Node-local state, below the kubelet plugins, the CNI and the agent (docs/architecture.md).

`state` keeps pod → Allocation as kubelet gave it; `attachments` keeps what the CNI moved and
how to put it back; `locks` and `files` are the one way both take locks and write; `paths` holds
the node's default folders and sockets. Importing this package imports nothing else.
"""
