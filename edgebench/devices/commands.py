"""`edgebench devices` and `edgebench lab up|down|status`."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import click

from edgebench.devices.inventory import Device, InventoryError, inventory_path, scan_devices


def _reachability(device: Device) -> str:
    """"ok", or the transport's message naming what is wrong and the fix."""
    from edgebench.devices.transport import TransportError, connect

    try:
        with connect(device) as transport:
            transport.check(["true"], timeout=device.transport.connect_timeout_s)
        return "ok"
    except (TransportError, OSError) as exc:
        return str(exc)


def _gib(value: Any) -> str:
    return "-" if value is None or value < 0 else f"{value / 2**30:.2f}"


@click.command()
@click.option("--no-check", is_flag=True, help="Do not try to reach the devices.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def devices(no_check: bool, as_json: bool) -> None:
    """List the devices of the inventory and whether each can be reached.

    The inventory maps the names you type (`--device jetson-orin`) to a profile in
    device_profiles/ and an address. It is $EDGEBENCH_INVENTORY or
    ~/.config/edgebench/inventory.yaml; `edgebench lab up` adds emulated devices to it.

    \b
    devices:
      jetson-orin: {profile: jetson-orin-nano-8gb, host: 192.168.1.20, user: nvidia, key: ~/.ssh/id_ed25519}
      pixel:       {profile: pixel-8, kind: adb, serial: 3A1B2C3D}
    """
    try:
        found, problems = scan_devices()
    except InventoryError as exc:
        raise click.ClickException(str(exc)) from None
    with ThreadPoolExecutor(max_workers=max(1, len(found))) as pool:
        reach = list(pool.map(_reachability, found)) if not no_check else ["not checked"] * len(found)
    rows = [{"name": d.name, "profile": d.profile.id, "transport": d.transport.kind, "address": d.address,
             "arch": d.profile.arch, "ram_bytes": int(d.profile.ram_bytes), "cores": d.profile.cores,
             "backends": d.profile.backends, "lab": bool(d.lab), "reachable": r} for d, r in zip(found, reach)]
    rows += [{"name": name, "profile": None, "transport": None, "address": None, "arch": None, "ram_bytes": None,
              "cores": None, "backends": [], "lab": False, "reachable": f"bad inventory entry: {problem}"}
             for name, problem in problems.items()]
    if as_json:
        click.echo(json.dumps({"inventory": str(inventory_path()), "devices": rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"devices ({inventory_path()})")
    for column in ("name", "profile", "address", "arch", "RAM GiB", "cores", "backends", "reachable"):
        table.add_column(column)
    for r in rows:
        ok = r["reachable"] in ("ok", "not checked")
        table.add_row(r["name"] + (" (lab)" if r["lab"] else ""), r["profile"] or "-", r["address"] or "-", r["arch"] or "-",
                      _gib(r["ram_bytes"]), str(r["cores"] or "-"), ",".join(r["backends"]),
                      r["reachable"] if ok else f"[red]{r['reachable']}[/red]")
    Console().print(table)


@click.group()
def lab() -> None:
    """The emulated device lab: real sshd per device, the profile's RAM and CPU enforced by cgroups.

    \b
    edgebench lab up                         # lab-pi4 (4 GiB) and lab-pizero (512 MiB)
    edgebench lab up --profile raspberry-pi-5-8gb --memory 2GiB
    edgebench deploy --device lab-pi4 --device lab-pizero --methods sgd,adamw,mezo
    edgebench collect && edgebench lab down

    Each device is its own sshd on a 127.0.0.1 port with its own host key (host-key checking
    stays on) inside a memory cgroup and CPU quota from the profile's `emulation` section,
    registered in the inventory as lab-<alias>. Needs root (cgroups) and openssh-server.
    State: $EDGEBENCH_LAB_DIR or ~/.local/state/edgebench/lab.
    """


@lab.command("up")
@click.option("--profile", "profiles", multiple=True,
              help="Profile to emulate (repeatable). Default: raspberry-pi-4-4gb and raspberry-pi-zero-2w.")
@click.option("--memory", default=None, help="Override the memory limit of these devices, e.g. 1GiB.")
@click.option("--cpus", default=None, type=click.FloatRange(min=0.01), help="Override the CPU limit (cores).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def lab_up(profiles: tuple[str, ...], memory: str | None, cpus: float | None, as_json: bool) -> None:
    """Start emulated devices (those already running are kept)."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    from edgebench.devices import lab as lab_mod
    from edgebench.devices.cgroups import CgroupError
    from edgebench.devices.profiles import ProfileError

    try:
        memory_bytes = int(TypeAdapter(ByteSize).validate_python(memory)) if memory else None
    except ValidationError:
        raise click.BadParameter(f"{memory!r}: write a size like 1GiB or 512MiB", param_hint="--memory") from None
    specs = [lab_mod.LabDevice(p, memory_bytes=memory_bytes, cpus=cpus)
             for p in (profiles or lab_mod.DEFAULT_PROFILES)]
    try:
        running = lab_mod.up(specs)
    except (lab_mod.LabError, CgroupError, ProfileError, InventoryError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(running, indent=2))
        return
    host_cores = os.cpu_count() or 1
    for dev in running:
        note = f" (this host has only {host_cores}: not a real limit)" if dev["cpus"] >= host_cores else ""
        click.echo(f"{dev['name']}: {dev['profile']} on 127.0.0.1:{dev['port']}, "
                   f"{_gib(dev['memory_bytes'])} GiB, {dev['cpus']:g} CPUs{note}")
    click.echo(f"registered in {inventory_path()}; try `edgebench deploy --device {running[0]['name']}`")


@lab.command("down")
@click.option("--purge", is_flag=True, help="Also delete the devices' work directories (uncollected runs).")
def lab_down(purge: bool) -> None:
    """Stop every emulated device: no process, cgroup, key or inventory entry is left."""
    from edgebench.devices import lab as lab_mod

    stopped = lab_mod.down(purge=purge)
    click.echo(f"stopped {', '.join(stopped)}" if stopped else "the lab was not running")


@lab.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def lab_status(as_json: bool) -> None:
    """Emulated devices, their sshd and their cgroup memory (usage, peak, OOM kills)."""
    from edgebench.devices import lab as lab_mod

    rows = lab_mod.status()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("the lab is not running; `edgebench lab up`")
    for r in rows:
        click.echo(f"{r['name']}: {'running' if r['running'] else 'STOPPED'} on port {r['port']}, "
                   f"processes {r['processes']}, memory {_gib(r.get('usage_bytes'))}/{_gib(r.get('limit_bytes'))} "
                   f"GiB (peak {_gib(r.get('peak_bytes'))}), OOM kills {r.get('oom_kills', '-')}")


COMMANDS = [devices, lab]
