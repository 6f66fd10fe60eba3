"""f-DP for decentralized learning (MATH.md §7): trade-off functions (``tradeoff``), PN-f-DP of
random walks (``random_walk``), DECOR's Sec-f-LDP (``decor_accounting``, ``decor``), the
``fdp-random-walk`` experiment kind (``experiment``) and ``dpdl fdp`` (``command``).
"""
