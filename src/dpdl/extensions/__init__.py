"""The other source papers' algorithms, one package each: its accounting, algorithm,
experiment kind and command. Extensions import the core; the core names them only as strings
(experiment kinds, commands), so no import runs from the core up into an extension.
"""
