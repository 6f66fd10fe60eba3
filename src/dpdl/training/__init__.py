"""Training: settings, the results of a run and the trainer facade (``dpdl.train``).

Below ``experiments`` (which extends these settings into configs) and above ``engine`` and
``accounting``; nothing here imports ``experiments``.
"""
