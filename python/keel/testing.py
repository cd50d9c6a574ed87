"""Helpers for programs that start keel jobs and must leave nothing behind (the tests in
tests/python, bench/torch_ddp.py): the end of a job's whole process tree, by pid."""
import os
import signal


def descendants(pid):
    """The pids of pid's process tree below it, from /proc. keel's workers are in process
    groups of their own, so a signal to the launcher's group does not reach them."""
    found = []
    try:
        for task in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, task)) as children:
                for child in map(int, children.read().split()):
                    found += [child] + descendants(child)
    except OSError:
        pass
    return found


def kill_tree(process):
    """SIGKILL to the launcher's group (started with start_new_session=True) and to every
    process below the launcher; then waits for the launcher."""
    tree = descendants(process.pid)
    for kill, target in [(os.killpg, process.pid)] + [(os.kill, pid) for pid in tree]:
        try:
            kill(target, signal.SIGKILL)
        except OSError:
            pass
    process.wait()
