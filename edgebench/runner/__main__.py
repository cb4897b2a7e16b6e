"""`python -m edgebench.runner SPEC.json --out DIR`: run one spec under the supervisor."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from edgebench.runner.oom_score import shield_from_oom_kill
from edgebench.runner.spec import RunSpec
from edgebench.runner.supervisor import run_spec
from edgebench.runner.worker import die_with_parent

EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m edgebench.runner",
        description="Run one RunSpec in a fresh worker process, sample it, and write the run "
                    "directory (meta.json, samples.jsonl, events.jsonl, result.json).")
    parser.add_argument("spec", help="RunSpec JSON file")
    parser.add_argument("--out", required=True, help="run directory to write")
    parser.add_argument("--root", default="/", help="filesystem root for sensors (tests)")
    args = parser.parse_args(argv)
    try:
        spec = RunSpec.load(args.spec)
    except (OSError, ValueError, TypeError) as exc:
        print(f"edgebench runner: {exc}", file=sys.stderr)
        return 2
    # Started by a host command (bench): if that dies, stop the run as an interrupt would.
    die_with_parent(signal.SIGTERM, "EDGEBENCH_PARENT_PID")
    shield_from_oom_kill()  # an OOM kill takes the worker, and this process records it
    result = run_spec(spec, args.out, root=args.root)
    print(json.dumps({k: result[k] for k in ("run_id", "status", "detail")}))
    return {"ok": 0, "interrupted": EXIT_INTERRUPTED}.get(result["status"], 1)


if __name__ == "__main__":
    sys.exit(main())
