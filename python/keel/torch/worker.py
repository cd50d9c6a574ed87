"""python3 -m keel.torch.worker SCRIPT ARGS...: one worker of `python3 -m keel.torch`.

Sets torch's variables (RANK, WORLD_SIZE, LOCAL_RANK) from keel's, runs the script as
__main__ in this process, and leaves with the exit code keel gives the way the job ended
for this process (keel.torch.JobEnd); a script that never called keel.torch.init() is told so.
"""
import os
import runpy
import sys


def _torch_variables():
    uid = int(os.environ.get("KEEL_UID", "0"))
    first = int(os.environ.get("KEEL_FIRST_UID", "0"))
    world = int(os.environ.get("KEEL_WORLD", "1"))
    worker = os.environ.get("KEEL_ROLE", "worker") == "worker"
    # A spare has no rank until it takes a failed one: it says rank 0, as dist.get_rank() does.
    rank = uid - first if worker else 0
    per_node = int(os.environ.get("KEEL_TORCH_LOCAL_WORLD", str(world)))
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world))
    os.environ.setdefault("LOCAL_RANK", str(rank % per_node))
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(per_node))


def main():
    if len(sys.argv) < 2:
        sys.stderr.write("usage: python3 -m keel.torch.worker SCRIPT ARGS...\n")
        return 2
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    _torch_variables()
    import keel.torch
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except keel.torch.JobEnd as end:
        code = end.code
        if code not in (0, None):
            sys.stderr.write("keel.torch: %s: %s\n" % (end.what, keel.strerror(end.status)))
    if not keel.torch.initialized():
        sys.stderr.write(
            "keel.torch: %s never called keel.torch.init(): under `python3 -m keel.torch` a "
            "script joins the job with keel.torch.init() before it builds its model, wraps it "
            "in DistributedDataParallel and calls keel.torch.register(model, optimizer, "
            "sampler) (docs/PYTORCH.md)\n" % script)
        return 1
    keel.torch.shutdown()
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
