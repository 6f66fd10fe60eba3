"""Network DP of token / random-walk algorithms (Cyffers & Bellet, MATH.md §6): ``accounting``,
``algorithm`` (ring and walk summation, histograms, random-walk SGD), ``experiment`` (the
``netdp-logreg`` kind) and ``command`` (``dpdl netdp``).
"""
