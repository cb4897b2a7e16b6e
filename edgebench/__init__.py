"""edgebench: what each memory-efficient way of computing gradients costs on a device."""

__version__ = "0.1.0"

from edgebench.quiet import quiet_libraries

quiet_libraries()
