"""How far past ``--time-limit T`` do ``solve`` and ``compare`` run? Whole commands, as a user runs them.

For every catalog cluster, each model given and each solver (plus ``compare``), the CLI runs as a fresh
process with ``--time-limit T`` and the wall time from launch to exit is recorded; the overrun is that wall
time minus T. It includes starting Python and importing the package and the solver libraries (``startup``
below: the same interpreter running ``hapmoe-milp models --json``), loading the specs, the last unit of work
between two deadline checks, the solver library's own overrun, re-evaluating the plan and printing it.
A deep-model case (a 1,024-layer Mixtral-S on 256 devices, the issue-20 report) is added unless
``--no-deep``. Regenerates the `time_limit` section of bench/RESULTS.md with ``--write``.

    python bench/time_limit.py --limit 2 --write
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import ROOT, command_line, update_section

SOLVERS = ("dp", "cpsat", "milp", "auto")


# the CLI in a fresh interpreter, reporting how long importing it and running the command took
CHILD = (
    "import sys, time\n"
    "t0 = time.perf_counter()\n"
    "from hapmoe_milp import cli\n"
    "t1 = time.perf_counter()\n"
    "rc = cli.run(sys.argv[1:])\n"
    "print(f'__bench {t1 - t0:.3f} {time.perf_counter() - t1:.3f}', file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def run(argv: list[str], timeout: float) -> tuple[float, float, int, str]:
    """(wall time of the process, time inside the command, exit status, last stderr line)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=timeout)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        rc, err = -9, "killed by the bench timeout"
    wall = time.perf_counter() - t0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    inside = next((float(ln.split()[2]) for ln in lines if ln.startswith("__bench ")), wall)
    last = next((ln for ln in reversed(lines) if not ln.startswith("__bench ")), "")
    return wall, inside, rc, last[:100]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=2.0, help="--time-limit given to every command")
    ap.add_argument("--models", default="mixtral-s,deepseek-v3")
    ap.add_argument("--clusters", default="", help="comma-separated (default: every catalog cluster)")
    ap.add_argument("--solvers", default=",".join(SOLVERS))
    ap.add_argument("--no-compare", action="store_true")
    ap.add_argument("--no-deep", action="store_true")
    ap.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = ap.parse_args()
    from hapmoe_milp.specs import Catalog

    T = args.limit
    clusters = [c for c in args.clusters.split(",") if c] or Catalog().cluster_names()
    solvers = [s for s in args.solvers.split(",") if s]
    startup = statistics.median(run(["models", "--json"], 300)[0] for _ in range(3))  # interpreter + imports
    print(f"startup (models --json): {startup:.2f} s", flush=True)
    cases: list[tuple[str, str, list[str]]] = []
    for model in args.models.split(","):
        for cl in clusters:
            for s in solvers:
                cases.append((model, cl, ["solve", "-m", model, "-c", cl, "--solver", s, "--json"]))
            if not args.no_compare:
                cases.append((model, cl, ["compare", "-m", model, "-c", cl, "--json"]))
    tmp = tempfile.TemporaryDirectory()
    if not args.no_deep:
        doc = yaml.safe_load((ROOT / "models" / "mixtral-s.yaml").read_text())
        doc.update(name="mixtral-s-1024l", num_layers=1024)
        deep = Path(tmp.name) / "mixtral-s-1024l.yaml"
        deep.write_text(yaml.safe_dump(doc))
        for s in solvers:
            cases.append(
                ("mixtral-s-1024l", "256-h800-910b", ["solve", "-m", str(deep), "-c", "256-h800-910b", "--solver", s])
            )
        cases.append(("mixtral-s-1024l", "256-h800-910b", ["compare", "-m", str(deep), "-c", "256-h800-910b"]))
    rows = []
    for model, cl, argv in cases:
        wall, inside, rc, last = run([*argv, "--time-limit", str(T)], timeout=T + 600)
        what = argv[0] if argv[0] == "compare" else f"solve {argv[argv.index('--solver') + 1]}"
        rows.append((model, cl, what, wall, rc, last, inside))
        print(
            f"{model:16s} {cl:15s} {what:12s} rc={rc:3d} wall={wall:6.1f} over={wall - T:5.1f} "
            f"in-command over={inside - T:5.1f}  {last}",
            flush=True,
        )
    tmp.cleanup()
    worst = max(rows, key=lambda r: r[3])
    worst_in = max(rows, key=lambda r: r[6])
    by_cmd: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        by_cmd.setdefault(r[2], []).append((r[3] - T, r[6] - T))
    lines = [
        "## Time limits: wall time of whole commands",
        "",
        f"Command: `{command_line()}` — {len(rows)} runs, each a fresh `hapmoe-milp` process with `--time-limit {T:g}`; "
        f"models {args.models}{'' if args.no_deep else ' and a 1,024-layer Mixtral-S on 256-h800-910b'}, every "
        "catalog cluster. Overrun = wall time from launch to exit minus the limit. Startup (the same interpreter "
        f"running `hapmoe-milp models --json`): {startup:.2f} s. Measured on the shared 2-core development machine "
        "(other jobs running), so these are upper bounds of what an idle machine shows.",
        "",
        "| command | runs | median overrun, whole process (s) | max overrun, whole process (s) | max overrun "
        "inside the command (s) |",
        "|---|---|---|---|---|",
    ]
    for cmd, xs in sorted(by_cmd.items()):
        whole = [a for a, _ in xs]
        lines.append(
            f"| {cmd} | {len(xs)} | {statistics.median(whole):.1f} | {max(whole):.1f} | {max(b for _, b in xs):.1f} |"
        )
    lines += [
        "",
        f"Worst whole process: {worst[2]} of {worst[0]} on {worst[1]}: {worst[3]:.1f} s for a {T:g} s limit "
        f"(exit {worst[4]}). Worst inside the command (after the interpreter started and imported the CLI): "
        f"{worst_in[2]} of {worst_in[0]} on {worst_in[1]}, {worst_in[6] - T:.1f} s past the limit.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        update_section("time_limit", text)


if __name__ == "__main__":
    main()
