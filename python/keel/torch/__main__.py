"""python3 -m keel.torch [keel run flags] [--] SCRIPT ARGS...: torchrun's place for keel.

Starts `keel run` with the flags given (torchrun's spellings with underscores are accepted,
--nproc_per_node and the like) and every worker as `python3 -m keel.torch.worker SCRIPT
ARGS`, which runs the script in the process with RANK, WORLD_SIZE and LOCAL_RANK set.
The workers find this package on PYTHONPATH and use one OpenMP thread each unless
OMP_NUM_THREADS says otherwise.
"""
import os
import sys

from keel import _library

# keel run's flags that take no value (tools/keel/run_options.c); every other takes one.
_SWITCHES = {"--agents", "--netns", "--ec-sync", "--quiet", "--help", "-h"}
# torchrun's flags that keel run knows by another name, or does not need.
_RENAMED = {"--nproc_per_node": "--nproc-per-node", "--node_rank": "--node-rank",
            "--rdzv_endpoint": "--rdzv-endpoint", "--rdzv_id": "--rdzv-id",
            "--max_restarts": "--max-restarts"}
_IGNORED = {"--standalone"}

USAGE = ("usage: python3 -m keel.torch [keel run flags] [--] SCRIPT ARGS...\n"
         "  e.g. python3 -m keel.torch --nproc-per-node 4 --spares 1 --on-failure replace "
         "-- train.py\n"
         "  (`keel run --help` lists the flags)\n")


def split(arguments):
    """(keel run flags, script and its arguments)."""
    flags = []
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        if argument == "--":
            return flags, arguments[index + 1:]
        if not argument.startswith("-"):
            return flags, arguments[index:]
        name, equals, value = argument.partition("=")
        name = _RENAMED.get(name, name)
        index += 1
        if name in _IGNORED:
            continue
        flags.append(name + equals + value)
        if not equals and name not in _SWITCHES and index < len(arguments):
            flags.append(arguments[index])
            index += 1
    return flags, []


def _workers_per_node(flags):
    """--nproc-per-node P, else -n/--nproc N (one node): what LOCAL_RANK counts within."""
    values = {}
    for index, flag in enumerate(flags):
        name, equals, value = flag.partition("=")
        if not equals and index + 1 < len(flags):
            value = flags[index + 1]
        values.setdefault(name, value)
    for name in ("--nproc-per-node", "-n", "--nproc"):
        if values.get(name, "").isdigit():
            return int(values[name])
    return 1


def main(arguments):
    flags, program = split(arguments)
    if "--help" in flags or "-h" in flags:
        sys.stdout.write(USAGE)
        return 0
    if not program:
        sys.stderr.write("keel.torch: no script given\n" + USAGE)
        return 2
    command = _library.command()
    if not os.access(command, os.X_OK):
        sys.stderr.write("keel.torch: %s is missing: run `make` (or set KEEL_BIN)\n" % command)
        return 2
    environment = dict(os.environ)
    root = _library.package_root()
    path = environment.get("PYTHONPATH")
    environment["PYTHONPATH"] = root + (os.pathsep + path if path else "")
    environment.setdefault("OMP_NUM_THREADS", "1")
    environment["KEEL_TORCH_LOCAL_WORLD"] = str(_workers_per_node(flags))
    argv = [command, "run"] + flags + ["--", sys.executable, "-m", "keel.torch.worker"] + program
    os.execve(command, argv, environment)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
