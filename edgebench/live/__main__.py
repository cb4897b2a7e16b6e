"""`python -m edgebench.live`: the live view without the rest of the CLI (e.g. on a device)."""

from edgebench.live.commands import live_command

if __name__ == "__main__":
    live_command(prog_name="python -m edgebench.live")
