"""Telemetry on the device: traces, clock pairs, and the sampler with its sensor readers.

One module per source family, each reading through a filesystem `root` (and a command
`runner` for vcgencmd) so tests point them at fixture trees: `memory` (process tree RSS,
USS/PSS, MemAvailable, cgroup v1/v2), `cpu` (utilisation, frequencies, quota throttling),
`power` (INA3221, jtop, RAPL, Pi 5 PMIC, Android battery; the labelled estimate), `rails`
(Jetson rail trees, so totals never count a rail twice), `battery` (the current sign and
external-power flags; `calibrate_battery_sign`),
`thermal` (zones, hwmon, Pi throttle flags), `gpu` (CUDA allocator, Jetson load, NVML).
`sampler` composes them; `probe` reports what a device has. Standard library only.
"""
