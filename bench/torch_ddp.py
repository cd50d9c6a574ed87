#!/usr/bin/env python3
"""keel.torch against its peer in one run, on examples/python/fashion_mnist_ddp.py: time per
training step (backend keel under `python3 -m keel.torch` vs gloo under torchrun), and recovery
from kill -9 of one rank (keel shrink and replace vs torchrun restarting from a checkpoint).
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
EXAMPLE = os.path.join(ROOT, "examples", "python", "fashion_mnist_ddp.py")
SUMMARY = re.compile(r"rank (\d+) world (\d+) steps (\d+) step_ms ([\d.]+) checksum ([0-9a-f]{8})")
# The recovery cases: (name, backend, launcher flags).
RECOVERY_CASES = (("keel shrink", "keel", ["--on-failure", "shrink"]),
                  ("keel replace", "keel", ["--spares", "1", "--on-failure", "replace"]),
                  ("torchrun restart", "gloo", ["--max_restarts", "1"]))


def options():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--python", default="/usr/bin/python3", help="the Python with torch")
    parser.add_argument("--torchrun", default="/usr/bin/torchrun")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"),
                        help="keel's build folder (KEEL_BUILD for keel.torch)")
    parser.add_argument("--nprocs", default="2,4", help="worker counts of the step-time runs")
    parser.add_argument("--reps", type=int, default=5, help="runs per step-time configuration")
    parser.add_argument("--train-samples", type=int, default=6000)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the step time")
    parser.add_argument("--recovery-nproc", type=int, default=4)
    parser.add_argument("--recovery-reps", type=int, default=3, help="kills per recovery case")
    parser.add_argument("--kill-step", type=int, default=20,
                        help="kill rank 1 once it has logged this step")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per job")
    args = parser.parse_args()
    args.build = os.path.abspath(args.build)  # the jobs run in folders of their own
    os.environ["KEEL_BUILD"] = args.build  # where keel.testing's import finds libkeel.so
    return args


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launcher(args, backend, nproc, flags, work):
    """The launcher's argv for the example: keel.torch for keel, torchrun for gloo."""
    if backend == "keel":
        return [args.python, "-m", "keel.torch", "--nproc-per-node", str(nproc), "--quiet"] + \
            flags + ["--"]
    return [args.torchrun, "--nproc_per_node", str(nproc), "--redirects", "1", "--tee", "1",
            "--monitor_interval", "0.1", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), "--log_dir", os.path.join(work, "torchrun")] + flags


def example(args, backend, step_log, extra=()):
    return [EXAMPLE, "--backend", backend, "--train-samples", str(args.train_samples),
            "--epochs", "1", "--test-samples", "100", "--step-log", step_log] + list(extra)


def environment(args):
    env = dict(os.environ, OMP_NUM_THREADS="1", KEEL_BUILD=args.build)
    env.pop("PYTHONUNBUFFERED", None)  # else print() writes a line's end apart: ranks' lines mix
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    return env


def run_job(argv, args, work, watch=None):
    """Runs one job in a session of its own, bounded by --timeout: (exit code or "timeout",
    its output). watch(), if given, is called every millisecond while the job runs."""
    from keel.testing import kill_tree  # loads libkeel.so: after --build is known
    pause = 0.001 if watch is not None else 0.02
    with open(os.path.join(work, "output"), "w+") as output:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output,
                                   stderr=subprocess.STDOUT, env=environment(args), cwd=work,
                                   start_new_session=True)
        deadline = time.monotonic() + args.timeout
        try:
            while process.poll() is None and time.monotonic() < deadline:
                if watch is not None:
                    watch()
                time.sleep(pause)
            code = process.returncode if process.returncode is not None else "timeout"
        finally:
            kill_tree(process)  # also what a finished launcher may have left behind
        output.seek(0)
        return code, output.read()


def read_log(path):
    """The step log's complete lines as (rank, pid, step, monotonic_ns) tuples."""
    try:
        with open(path) as log:
            text = log.read()
    except FileNotFoundError:
        return []
    return [tuple(map(int, line.split())) for line in text.splitlines(True) if
            line.endswith("\n")]


def step_ms(records, warmup):
    """Median over ranks of each rank's mean time per step after its first `warmup` steps."""
    per_rank = []
    for rank in sorted({record[0] for record in records}):
        times = sorted((step, ns) for r, _, step, ns in records if r == rank)[warmup:]
        if len(times) >= 2:
            per_rank.append((times[-1][1] - times[0][1]) / 1e6 / (times[-1][0] - times[0][0]))
    return median(per_rank)


def start_s(records, launched_ns):
    """Seconds from the launcher's start until every rank has logged its first step."""
    firsts = {}
    for rank, _, _, ns in records:
        firsts[rank] = min(ns, firsts.get(rank, ns))
    return (max(firsts.values()) - launched_ns) / 1e9 if firsts else None


class Killer:
    """Watches the step log; once rank 1 has logged step `step`, kill -9 of its pid."""

    def __init__(self, path, step):
        self.path, self.step, self.pid, self.ns = path, step, None, None

    def __call__(self):
        if self.pid is not None:
            return
        for rank, pid, step, _ in read_log(self.path):
            if rank == 1 and step >= self.step:
                os.kill(pid, signal.SIGKILL)
                self.pid, self.ns = pid, time.monotonic_ns()
                return


def recovery(records, killer, nproc, restart):
    """Milliseconds from the kill until every survivor logged a step past the killed rank's
    last one (restart: until every rank of the new processes logged its first step), and
    until the first new process (a replacement) logged a step; None where it did not."""
    before = {pid for _, pid, _, ns in records if ns < killer.ns} - {killer.pid}
    last = max(step for _, pid, step, ns in records if pid == killer.pid and ns < killer.ns)
    first = {}  # pid -> (rank, ns) of its first line that counts
    for rank, pid, step, ns in sorted(records, key=lambda record: record[3]):
        counts = ns > killer.ns and (pid not in before or step > last)
        if counts and pid != killer.pid and pid not in first:
            first[pid] = (rank, ns)
    new = [first[pid] for pid in first if pid not in before]
    waited = new if restart else [first.get(pid) for pid in before]
    complete = len({rank for rank, _ in new}) == nproc if restart else None not in waited
    done = max(ns for _, ns in waited) if complete and waited else None
    started = min(ns for _, ns in new) if new else None
    return {"recovery_ms": (done - killer.ns) / 1e6 if done else None,
            "new_first_step_ms": (started - killer.ns) / 1e6 if started else None}


def attempt(args, work, backend, nproc, flags=(), extra=(), kill_step=None):
    """One job in a fresh folder: its command, exit code, step records and summary lines."""
    folder = tempfile.mkdtemp(dir=work)
    log = os.path.join(folder, "steps.log")
    extra = [item.replace("{dir}", folder) for item in extra]
    argv = launcher(args, backend, nproc, list(flags), folder) + \
        example(args, backend, log, extra)
    killer = Killer(log, kill_step) if kill_step else None
    launched = time.monotonic_ns()
    code, output = run_job(argv, args, folder, killer)
    records = read_log(log)
    result = {"command": shlex.join(argv).replace(folder, "$DIR"), "code": code,
              "records": records, "killer": killer, "start_s": start_s(records, launched),
              "summaries": [match.groups() for match in SUMMARY.finditer(output)],
              "output_tail": output[-600:]}
    shutil.rmtree(folder, ignore_errors=True)
    return result


def measure_steps(args, work, nprocs, commands):
    """Rows per worker count: the step times of each backend, runs alternating."""
    runs = {(nproc, backend): [] for nproc in nprocs for backend in ("keel", "gloo")}
    for rep in range(args.reps):
        for nproc in nprocs:
            for backend in ("keel", "gloo") if rep % 2 == 0 else ("gloo", "keel"):
                progress("step time rep %d, %d ranks, %s" % (rep + 1, nproc, backend))
                job = attempt(args, work, backend, nproc)
                commands.setdefault("%s, %d ranks" % (backend, nproc), job["command"])
                runs[(nproc, backend)].append(job)
    rows = []
    for nproc in nprocs:
        row = {"nproc": nproc}
        for backend in ("keel", "gloo"):
            jobs = runs[(nproc, backend)]
            times = [step_ms(job["records"], args.warmup) if job["code"] == 0 else None
                     for job in jobs]
            row[backend + "_ms"] = median(times)
            row[backend + "_runs_ms"] = times
            row[backend + "_start_s"] = median([job["start_s"] for job in jobs
                                               if job["code"] == 0])
            row[backend + "_failed"] = [failure(job) for job in jobs if job["code"] != 0]
            row[backend + "_checksums"] = sorted({s[4] for job in jobs for s in job["summaries"]})
        row["ratio"] = ratio(row["keel_ms"], row["gloo_ms"])
        row["paired_ratio"] = median(map(ratio, row["keel_runs_ms"], row["gloo_runs_ms"]))
        rows.append(row)
    return rows


def measure_recovery(args, work, commands):
    """Rows per recovery case, the kills alternating between cases."""
    trials = {name: [] for name, _, _ in RECOVERY_CASES}
    for rep in range(args.recovery_reps):
        for name, backend, flags in RECOVERY_CASES:
            progress("recovery rep %d, %s" % (rep + 1, name))
            extra = ["--checkpoint", "{dir}/checkpoint.pt", "--checkpoint-every", "1"] \
                if backend == "gloo" else []
            job = attempt(args, work, backend, args.recovery_nproc, flags, extra, args.kill_step)
            commands.setdefault(name, job["command"])
            trials[name].append(trial(job, args, backend == "gloo"))
    rows = []
    for name, _, _ in RECOVERY_CASES:
        done = [t for t in trials[name] if t["recovery_ms"] is not None]
        rows.append({"case": name, "recovery_ms": median([t["recovery_ms"] for t in done]),
                     "step_ms_before": median([t["step_ms_before"] for t in done]),
                     "new_first_step_ms": median([t["new_first_step_ms"] for t in done]),
                     "trials": trials[name]})
    torchrun = rows[-1]["recovery_ms"]
    for row in rows:
        row["torchrun_over_this"] = ratio(torchrun, row["recovery_ms"])
    return rows


def trial(job, args, restart):
    """One kill's figures, or why there are none."""
    killer = job["killer"]
    if killer.ns is None:
        return {"recovery_ms": None, "new_first_step_ms": None,
                "error": "rank 1 never logged the step to kill at: " + failure(job)}
    figures = recovery(job["records"], killer, args.recovery_nproc, restart)
    figures["step_ms_before"] = step_ms([r for r in job["records"] if r[3] < killer.ns],
                                        args.warmup)
    figures["killed_after_step"] = max(step for _, pid, step, ns in job["records"]
                                       if pid == killer.pid and ns < killer.ns)
    figures["exit"] = job["code"]
    figures["final_worlds"] = sorted({int(s[1]) for s in job["summaries"]})
    if figures["recovery_ms"] is None:
        figures["error"] = "no recovery logged: " + failure(job)
    return figures


def failure(job):
    return "exit %s: %s" % (job["code"], "".join(job["output_tail"].strip().splitlines()[-1:]))


def median(values):
    """The median of the values that are there, None if none is."""
    values = [value for value in values if value is not None]
    return statistics.median(values) if values else None


def ratio(numerator, denominator):
    return numerator / denominator if numerator and denominator else None


def progress(text):
    print("torch_ddp: " + text, file=sys.stderr, flush=True)


def machine(args):
    version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=120).stdout.strip()
    with open("/proc/loadavg") as loadavg:
        load = loadavg.read().split()[:3]
    return {"nproc": os.cpu_count(), "torch": version, "python": args.python,
            "load": " ".join(load), "utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def cell(value, form="%.2f"):
    return form % value if value is not None else "-"


def print_text(result, args):
    host = result["machine"]
    print("# keel.torch vs gloo/torchrun, %s: %d cores, load %s, torch %s (%s)"
          % (host["utc"], host["nproc"], host["load"], host["torch"], host["python"]))
    print("# every job: OMP_NUM_THREADS=1 PYTHONPATH=%s/python KEEL_BUILD=%s, cwd $DIR"
          % (ROOT, args.build))
    for name, command in result["commands"].items():
        print("# %s: %s" % (name, command))
    print("\n## Step time, ms: each rank's mean from its step log (after step %d), median over"
          " ranks; median of %d runs; pair: median of keel / gloo over the back-to-back runs\n"
          % (args.warmup, args.reps))
    print("| ranks | keel | gloo | keel / gloo | keel / gloo, pairs | keel runs | gloo runs |"
          " parameters | start to step 1, s: keel / gloo |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in result["step_time"]:
        same = row["keel_checksums"] == row["gloo_checksums"] and len(row["keel_checksums"]) == 1
        runs = [", ".join(cell(value) for value in row[backend + "_runs_ms"]) +
                "".join(" FAILED (%s)" % why for why in row[backend + "_failed"])
                for backend in ("keel", "gloo")]
        print("| %d | %s | %s | %s | %s | %s | %s | %s | %s / %s |"
              % (row["nproc"], cell(row["keel_ms"]), cell(row["gloo_ms"]), cell(row["ratio"]),
                 cell(row["paired_ratio"]), runs[0], runs[1], "same bits" if same else "differ",
                 cell(row["keel_start_s"]), cell(row["gloo_start_s"])))
    print("\n## Recovery from kill -9 of rank 1 at step %d, %d ranks: ms from the kill to the"
          " last survivor's next step (torchrun: every new rank's first); median of %d\n"
          % (args.kill_step, args.recovery_nproc, args.recovery_reps))
    print("| case | recovery | torchrun / this | new process's first step | step before |"
          " trials (final world) |")
    print("|---|---|---|---|---|---|")
    for row in result["recovery"]:
        print("| %s | %s | %s | %s | %s | %s |"
              % (row["case"], cell(row["recovery_ms"], "%.1f"), cell(row["torchrun_over_this"]),
                 cell(row["new_first_step_ms"], "%.1f"), cell(row["step_ms_before"]),
                 ", ".join(map(trial_text, row["trials"]))))


def trial_text(trial):
    if trial["recovery_ms"] is None:
        return "FAILED (%s)" % trial["error"]
    code = "" if trial["exit"] == 0 else ", exit %s" % trial["exit"]
    return "%.1f (%s%s)" % (trial["recovery_ms"], "/".join(map(str, trial["final_worlds"])), code)


def main():
    args = options()
    work = tempfile.mkdtemp(prefix="keel-torch-bench.")
    try:
        result = {"machine": machine(args), "commands": {}}
        nprocs = [int(n) for n in args.nprocs.split(",") if n]
        result["step_time"] = measure_steps(args, work, nprocs, result["commands"])
        result["recovery"] = measure_recovery(args, work, result["commands"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        print_text(result, args)
    failed = any(row["keel_ms"] is None or row["gloo_ms"] is None for row in result["step_time"])
    failed |= any(row["recovery_ms"] is None for row in result["recovery"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
