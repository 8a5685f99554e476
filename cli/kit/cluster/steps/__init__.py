"""One module per stage of `kit up`: look at the facts, decide, act.

Each stage returns what it changed on each host, so a second `up` on an
unchanged cluster can say it changed nothing.
"""
