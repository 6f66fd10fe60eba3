"""A consortium: named parties, each on its own machine, training over mutual-TLS gRPC links
between graph neighbours only (docs/THREAT_MODEL.md, transport).

* :mod:`.settings`: the consortium file (TOML, validated): parties, nodes, addresses, PKI.
* :mod:`.pki`: ``dpdl consortium init``: a consortium CA and each party's key and certificate.
* :mod:`.wire`: tensors as raw bytes with dtype, shape, step, round and sender (no pickle).
* :mod:`.sent_ledger`: every message a party sent, on its own disk, fsync'd before sending.
* :mod:`.transport`: the gRPC server (outbox) and clients (fetch from neighbours).
* :mod:`.runtime`: :class:`ConsortiumRuntime`, the :class:`~dpdl.engine.runtime.Runtime`.
"""
