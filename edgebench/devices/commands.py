"""`edgebench devices` and `edgebench lab up|down|status`; `devices calibrate` ships and runs a
measurement on the device, so it is the fleet's (fleet/commands/calibrate.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from edgebench.cli_types import SIZE, FiniteRange
from edgebench.devices.inventory import (
    InventoryError,
    get_device,
    inventory_path,
    read_inventory,
    remove_entry,
)
from edgebench.errors import EdgebenchError
from edgebench.terminal import echo

if TYPE_CHECKING:
    from edgebench.devices.detect import HostKey
    from edgebench.devices.lab import LabDevice
    from edgebench.devices.readiness import Readiness


class UserError(EdgebenchError, click.ClickException):
    """A mistake the user can fix: one line, exit code 2."""

    exit_code = 2


def _gib(value: Any) -> str:
    return "-" if value is None or value < 0 else f"{value / 2**30:.2f}"


@click.group(invoke_without_command=True)
@click.option("--no-check", is_flag=True, help="Do not contact the devices.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def devices(ctx: click.Context, no_check: bool, as_json: bool) -> None:
    """The devices of the inventory: profile, arch, RAM and whether each is ready.

    The inventory maps the names you type (`--device jetson-orin`) to a profile in
    device_profiles/ and an address. It is $EDGEBENCH_INVENTORY or
    ~/.config/edgebench/inventory.yaml; `edgebench devices add` and `edgebench lab up` write it.
    A labgrid board farm's places are listed too ($LG_COORDINATOR or `labgrid: {coordinator:
    HOST:PORT}` in the inventory; see README "Board farm").

    \b
    edgebench devices add orin --host 192.168.1.20 --user nvidia
                                          # detects the board, checks it
    edgebench devices check orin --fix    # installs what pip can
    edgebench devices remove orin

    \b
    devices:
      jetson-orin: {profile: jetson-orin-nano-8gb, host: 192.168.1.20,
                    user: nvidia, key: ~/.ssh/id_ed25519}
      pixel:       {profile: pixel-8, kind: adb, serial: 3A1B2C3D}
    """
    if ctx.invoked_subcommand is not None:
        return
    from edgebench.devices.listing import device_rows

    try:
        rows = device_rows(contact=not no_check)
    except InventoryError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"inventory": str(inventory_path()), "devices": rows}, indent=2))
        return
    _print_devices(rows)
    if any(not r["readiness"].startswith(("ready", "not checked")) for r in rows):
        echo("`edgebench devices check NAME` lists each problem with the command that fixes it")


def _print_devices(rows: list[dict[str, Any]]) -> None:
    """The inventory as a table that fits the terminal, else a card per device (edgebench.terminal)."""
    from edgebench.terminal import Field, fitted
    from edgebench.terminal import console as terminal

    def readiness(r: dict[str, Any]) -> str:
        ready = r["readiness"].startswith(("ready", "not checked"))
        said: str = r["readiness"] if ready or r["reachable"] == "ok" else r["reachable"]
        return said

    def kind(r: dict[str, Any]) -> str:
        return " (lab)" if r["lab"] else " (labgrid)" if r.get("labgrid_place") else ""

    console = terminal()
    for part in fitted(f"devices ({inventory_path()})",
                       [Field("name", "name", lambda r: r["name"] + kind(r), True),
                        Field("profile", "profile", lambda r: r["profile"] or "-", True)],
                       [Field("address", "address", lambda r: r["address"] or "-"),
                        Field("arch", "arch", lambda r: r["arch"] or "-"),
                        Field("RAM GiB", "RAM GiB", lambda r: _gib(r["ram_bytes"])),
                        Field("cores", "cores", lambda r: str(r["cores"] or "-")),
                        Field("readiness", "readiness", readiness)], rows, console.width):
        console.print(part)


def _print_readiness(readiness: Readiness) -> None:
    """Each finding with the command that fixes it: a table that fits the terminal, else a card each."""
    from edgebench.terminal import Field, fitted
    from edgebench.terminal import console as terminal

    console = terminal()
    for part in fitted(f"{readiness.device}: {readiness.summary()}",
                       [Field("item", "item", lambda f: f["item"], True),
                        Field("status", "status", lambda f: f["status"], True)],
                       [Field("found", "found", lambda f: f["detail"]), Field("fix", "fix", lambda f: f["fix"] or "")],
                       [vars(f) for f in readiness.findings], console.width):
        console.print(part)


def _check_and_fix(name: str, fix: bool, only: tuple[str, ...], quiet: bool) -> tuple[Readiness, list[Any]]:
    """Checks the device; with `fix`, runs the safe fixes under a progress bar and checks again."""
    from edgebench.devices import readiness as ready_mod

    try:
        device = get_device(name)
    except InventoryError as exc:
        raise UserError(str(exc)) from None
    if fix and name not in read_inventory():
        raise UserError(f"{name} is not in {inventory_path()}, so --fix cannot point it at a venv; install into "
                        "this host's own environment instead (`devices check` lists the packages)")
    result = ready_mod.check(device)
    if not fix or not result.reachable:
        return result, []
    todo = ready_mod.fix_plan(result, only)
    if not todo:
        if not quiet:
            echo("nothing --fix can do: the remaining fixes need you (sudo, another package manager)")
        return result, []
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=quiet) as progress:
        task = progress.add_task(f"{name}: fixing", total=len(todo))
        started: list[str] = []

        def step(command: str) -> None:
            if started:
                progress.advance(task)
            started.append(command)
            progress.update(task, description=f"{name}: {command[:100]}")

        fixed = ready_mod.fix(device, result, only or None, step=step)
        progress.update(task, completed=len(fixed), description=f"{name}: done")
    if not quiet:
        for r in fixed:
            last = r.output.splitlines()[-1] if r.output else ""
            click.echo(f"{'fixed' if r.ok else 'FAILED'} {r.item}: `{r.command}`" + ("" if r.ok else f"\n  {last}"))
    return ready_mod.check(get_device(name)), fixed


@devices.command("check", short_help="What a device lacks, each piece with the command that fixes it.")
@click.argument("name")
@click.option("--fix", is_flag=True,
              help="Run the safe fixes: pip installs into a venv in the device's work directory.")
@click.option("--only", multiple=True, metavar="ITEM",
              help="With --fix: only these items (repeatable), e.g. --only executorch.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def devices_check(name: str, fix: bool, only: tuple[str, ...], as_json: bool) -> None:
    """What the device has and lacks to run sweeps, each missing piece with the command that fixes it.

    Checks Python, edgebench's on-device libraries and their builds (a CPU or CUDA torch,
    ExecuTorch, ONNX Runtime training where the arch has a wheel), free disk, the sensors
    the profile names (power rails, thermal zones, jtop on a Jetson, the battery on a
    phone) and the clock. Exit code 1 when something stops a deploy.
    """
    result, fixed = _check_and_fix(name, fix, only, as_json)
    if as_json:
        click.echo(json.dumps({**result.to_json(), "fixed": [vars(r) for r in fixed]}, indent=2))
    else:
        _print_readiness(result)
    if not result.ready:
        raise SystemExit(1)


def _ask(question: Callable[[], Any], unanswered: str) -> Any:
    """The answer to a prompt; without a terminal (input ended before an answer) a UserError
    saying which option answers it instead. Ctrl-C at a terminal stays an interruption."""
    import sys

    try:
        return question()
    except click.Abort:
        if sys.stdin is not None and sys.stdin.isatty():
            raise
        raise UserError(unanswered) from None


def _asked_trust(offered: HostKey) -> bool:
    """Whether the user trusts a host key known_hosts does not list (the prompt of `devices add`)."""
    from edgebench.devices.detect import keygen_hint

    return bool(_ask(lambda: click.confirm(
        f"Trust {offered.host_spec}'s {offered.algorithm} key {offered.fingerprint}? (compare "
        f"`{keygen_hint(offered)}` on the board)", default=False, err=True),
        f"{offered.host_spec} offers {offered.algorithm} key {offered.fingerprint}, and no one answered "
        f"whether to trust it (no terminal): compare `{keygen_hint(offered)}` on the board, then "
        "run again with --trust-host-key SHA256:...; nothing written"))


def _asked_profile(name: str, candidates: list[str], default: str) -> str:
    """The profile the user picks among the candidates, detection's proposal the default."""
    return str(_ask(lambda: click.prompt(f"{name}: which profile", type=click.Choice(candidates), default=default,
                                         err=True),
                    f"{name}: no one answered which profile (no terminal) among {', '.join(candidates)}; pass "
                    f"--profile {default} (proposed) or --yes"))


@devices.command("add", short_help="Add a board: trust its host key, detect it, pick a profile, check.")
@click.argument("name")
@click.option("--host", help="The board's address (SSH).")
@click.option("--serial", help="An adb serial instead of --host (`adb devices -l` lists them).")
@click.option("--user", "-u", help="SSH user (default: the profile's, e.g. pi, nvidia).")
@click.option("--port", "-p", type=click.IntRange(1, 65535), help="SSH port (default 22; Termux: 8022).")
@click.option("--key", "-k", help="Private key file (default: the ssh agent and ~/.ssh keys).")
@click.option("--profile", help="Profile id or alias (pi5, orin-nano, jetson-orin): skips detection's proposal.")
@click.option("--trust-host-key", "fingerprint", metavar="SHA256:...",
              help="Trust the host key without asking, only if it has this fingerprint (for scripts).")
@click.option("--known-hosts", help="known_hosts file to check and extend (default ~/.ssh/known_hosts).")
@click.option("--python", help="The board's Python (default: the profile's, e.g. python3, else one that runs).")
@click.option("--workdir", help="Where edgebench keeps its files on the board (default: the profile's, "
                                "edgebench-work, in the login user's home there).")
@click.option("--root", help="Read board files (/proc, /sys, /etc) under this directory: emulated boards.")
@click.option("--yes", "-y", is_flag=True, help="Accept the proposed profile without asking.")
@click.option("--no-check", is_flag=True, help="Do not run `devices check` afterwards.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (what was found and written).")
def devices_add(name: str, no_check: bool, as_json: bool, **board: Any) -> None:
    """Add a board: check its host key, detect what it is, pick its profile, write the entry.

    Connects over SSH (or adb with --serial), shows the host key's fingerprint and asks
    before trusting it (--trust-host-key SHA256:... for scripts: it is compared, never
    skipped), detects the board (device-tree model, arch, RAM, cores, OS, Python), proposes
    the matching profile (a board of no known family: linux-x86_64 or linux-aarch64), writes
    the inventory entry (with the board's RAM and cores where the profile's differ) and runs
    `devices check`.

    \b
    edgebench devices add pi5 --host 192.168.1.30 --user pi
    edgebench devices add orin --host orin.local --user nvidia \\
        --profile jetson-orin                  # asks: Nano or AGX
    edgebench devices add pixel --host 192.168.1.40 --port 8022 \\
        --profile android                      # SSH into Termux
    """
    from edgebench.devices.add import AddError, add_board

    try:
        added = add_board(name, say=(lambda _: None) if as_json else click.echo, trust_key=_asked_trust,
                          choose=lambda candidates, default: _asked_profile(name, candidates, default), **board)
    except AddError as exc:
        raise UserError(str(exc)) from None
    result = None if no_check else _check_and_fix(name, False, (), as_json)[0]
    if as_json:
        click.echo(json.dumps({"name": name, "entry": added.entry, "facts": vars(added.facts), "notes": added.notes,
                               "readiness": result.to_json() if result else None}, indent=2))
    elif result is not None:
        _print_readiness(result)
        if not result.ready:
            echo(f"`edgebench devices check {name} --fix` runs the pip installs; the others are yours to run")


@devices.command("remove", short_help="Remove a device from the inventory.")
@click.argument("name")
def devices_remove(name: str) -> None:
    """Remove a device from the inventory (its known_hosts line and files on the board stay)."""
    try:
        entry = remove_entry(name)
    except InventoryError as exc:
        raise UserError(str(exc)) from None
    if entry.get("lab"):
        click.echo(f"removed {name}; it is a lab device: `edgebench lab down` stops it")
    else:
        click.echo(f"removed {name} from {inventory_path()}")




@click.group()
def lab() -> None:
    """The emulated device lab: real sshd per device, the profile's RAM and CPU enforced by cgroups.

    \b
    edgebench lab up                # lab-pi4 (4 GiB) and lab-pizero (512 MiB)
    edgebench lab up --profile raspberry-pi-5-8gb --memory 2GiB
    edgebench lab up --arch arm64   # lab-pi4-arm64: arm64 wheels under qemu
    edgebench lab up --no-python    # lab-pi4-nopy: a phone's shell tools only
    edgebench deploy --device lab-pi4 --device lab-pizero \\
        --methods sgd,adamw,mezo
    edgebench collect && edgebench lab down

    Each device is its own sshd on a 127.0.0.1 port with its own host key (host-key checking
    stays on) inside a memory cgroup and CPU quota from the profile's `emulation` section,
    registered in the inventory as lab-<alias>. A device is the board it names: its cgroup holds
    the board's RAM and, resident inside it, the OS's idle footprint the profile gives for that
    RAM (`os_memory`), so a run meets the budget it would meet on the board (`edgebench predict
    --device lab-pi4` shows it). Needs root (cgroups) and openssh-server.
    State: $EDGEBENCH_LAB_DIR or ~/.local/state/edgebench/lab.
    """


@lab.command("up")
@click.option("--profile", "profiles", multiple=True,
              help="Profile to emulate (repeatable). Default: raspberry-pi-4-4gb and raspberry-pi-zero-2w.")
@click.option("--memory", type=SIZE, default=None,
              help="The emulated board's RAM instead of the profile's, e.g. 1GiB (its OS's idle footprint for that "
                   "RAM is held inside it).")
@click.option("--cpus", default=None, type=FiniteRange(min=0.01, max=1024), help="Override the CPU limit (cores).")
@click.option("--arch", type=click.Choice(["host", "arm64"]), default="host", show_default=True,
              help="arm64: the device's python is an arm64 Python with arm64 wheels under qemu user-mode "
                   "emulation (built once into ~/.cache/edgebench/arm64; step times not representative).")
@click.option("--no-python", is_flag=True,
              help="A device with no Python (lab-<alias>-nopy): its sessions find only a phone's shell tools, so "
                   "only the native ExecuTorch worker runs there, under the shell sweep.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def lab_up(profiles: tuple[str, ...], memory: int | None, cpus: float | None, arch: str, no_python: bool,
           as_json: bool) -> None:
    """Start emulated devices (those already running are kept)."""
    from edgebench.devices import lab as lab_mod
    from edgebench.devices.cgroups import CgroupError
    from edgebench.devices.profiles import ProfileError

    defaults = lab_mod.DEFAULT_ARM64_PROFILES if arch == "arm64" else lab_mod.DEFAULT_PROFILES
    if no_python and arch != "host":
        raise click.BadParameter("a device without Python runs the native worker directly, which an emulated arm64 "
                                 "device cannot exec without binfmt_misc; use --arch host", param_hint="--no-python")
    specs = [lab_mod.LabDevice(p, memory_bytes=memory, cpus=cpus, arch=None if arch == "host" else arch,
                               no_python=no_python)
             for p in (profiles or defaults)]
    try:
        running = _lab_up(specs, arch, quiet=as_json)
    except (lab_mod.LabError, CgroupError, ProfileError, InventoryError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(running, indent=2))
        return
    host_cores = os.cpu_count() or 1
    for dev in running:
        note = f" (this host has only {host_cores}: not a real limit)" if dev["cpus"] >= host_cores else ""
        if dev.get("emulator"):
            note += f"; arm64 under {dev['emulator']} (step times not representative)"
        click.echo(f"{dev['name']}: {dev['profile']} on 127.0.0.1:{dev['port']}, "
                   f"{_gib(dev['memory_bytes'])} GiB, {dev['cpus']:g} CPUs{note}; its OS at idle held resident: "
                   f"{(dev.get('os_memory_bytes') or 0) / 2**20:,.0f} MiB ({dev.get('os_memory_source', '-')})")
    click.echo(f"registered in {inventory_path()}; try `edgebench deploy --device {running[0]['name']}`")


def _lab_up(specs: list[LabDevice], arch: str, quiet: bool) -> list[dict[str, Any]]:
    """lab.up, with a progress bar while the arm64 emulation root is built (first time only)."""
    from edgebench.devices import arm64
    from edgebench.devices import lab as lab_mod

    state = arm64.status() if arch == "arm64" else {"state": "built"}
    if state["state"] == "built":
        return lab_mod.up(specs)
    if not quiet:
        click.echo(f"building the arm64 emulation root once: {state['detail']}")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=quiet) as progress:
        task = progress.add_task("arm64 root", total=len(arm64.STEPS))
        running = lab_mod.up(
            specs, step=lambda i, what: progress.update(task, completed=i, description=f"arm64: {what}")
        )
        progress.update(task, completed=len(arm64.STEPS), description="arm64 root built")
    return running


@lab.command("down")
@click.option("--purge", is_flag=True, help="Also delete the devices' work directories (uncollected runs), also "
                                           "those an earlier plain `lab down` left.")
def lab_down(purge: bool) -> None:
    """Stop every emulated device: no process, cgroup, key or inventory entry is left."""
    from edgebench.devices import lab as lab_mod

    stopped = lab_mod.down(purge=purge, log=click.echo)
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


