"""DP decentralized linear regression (MATH.md §5): ``accounting`` (pure-DP ε of the noise
schedule), ``algorithm`` and ``experiment`` (the ``linreg`` kind of ``dpdl run``).
"""
