"""Figures from raw readings: one module per figure family, the only place a figure is made.

Every device runtime (the Python supervisor, the shell sweep of a device with no Python, and
whatever comes next) records raw readings only: counters and values as the kernel and the
sensors give them, in the units their files use, with the paths and names they were read
from (`readings.py` defines them). The host turns them into figures here, the same way for
every runtime: `steps` (step time, throughput, losses), `memory` (device RAM), `power`
(measured power and what it covers), `estimate` (estimated power), `thermal` (temperatures),
`cpu` (CPU use and the disturbed flag), `status` (how a run ended), `carbon` (the estimated
CO2 of an energy figure, at a grid's intensity), and `run`, which assembles a run's figures.
A reading that cannot be interpreted becomes a named gap (`gaps`), never a wrong number.
"""
