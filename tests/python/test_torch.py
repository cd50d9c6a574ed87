"""The PyTorch binding in jobs of real processes under `python3 -m keel.torch`: a rank killed
(kill -9 by KEEL_FAULT) in forward, in backward and in the optimizer step, under shrink and
replace; a replacement that meets rebuilt DDP buckets; JIT restarts; the collectives, the
refusals and the messages. Runs as `test_torch.py [Recovery|Api]`; exits 77 without torch."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import torch  # noqa: F401 (only whether it is there)
except ImportError:
    print("test_torch: skipped: python3-torch is not installed (scripts/deps.sh installs it)")
    sys.exit(77)

SOURCE = os.environ.get("KEEL_SOURCE", os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
EXAMPLE = os.path.join(SOURCE, "examples", "python", "fashion_mnist_ddp.py")
SCRIPTS = os.path.join(SOURCE, "tests", "python")
sys.path.insert(0, os.path.join(SOURCE, "python"))
from keel.testing import kill_tree  # noqa: E402 (after the path it needs)
SLOWDOWN = int(os.environ.get("KEEL_TEST_SLOWDOWN", "1"))
JOB_SECONDS = 150 * SLOWDOWN
# Ten steps an epoch with three ranks of 32 samples, two epochs; dropout draws from the
# RNG state a newcomer must receive.
TRAINING = ["--train-samples", "960", "--test-samples", "200", "--epochs", "2",
            "--dropout", "0.2"]
CHECKSUM = re.compile(r"rank (\d+) world (\d+) steps (\d+) step_ms [\d.]+ checksum ([0-9a-f]{8})")


class Job:
    """One `python3 -m keel.torch` job, bounded in time; its output and its events."""

    def __init__(self, flags, script, arguments=(), fault=None, transport=None, variables=None):
        self.folder = tempfile.mkdtemp(prefix="keel-test-torch-")
        events = os.path.join(self.folder, "events.jsonl")
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.path.join(SOURCE, "python")
        environment.pop("KEEL_FAULT", None)
        # Unbuffered, print() writes a line's text and its newline apart, and the lines of
        # several ranks mix; buffered, each print(flush=True) is one write.
        environment.pop("PYTHONUNBUFFERED", None)
        if fault is not None:
            environment["KEEL_FAULT"] = fault
        if transport is not None:
            environment["KEEL_TRANSPORT"] = transport
        environment.update(variables or {})
        command = [sys.executable, "-m", "keel.torch", "--quiet", "--events", events]
        command += list(flags)
        if "--ckpt" in flags:
            command += ["--ckpt-dir", os.path.join(self.folder, "ckpt")]
        command += ["--", script] + list(arguments)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=environment, start_new_session=True, text=True)
        try:
            self.output, _ = process.communicate(timeout=JOB_SECONDS)
        except subprocess.TimeoutExpired:
            kill_tree(process)
            self.output, _ = process.communicate()
            self.output += "\n[test: the job passed %d s and was killed]" % JOB_SECONDS
        self.code = process.returncode
        self.events = []
        if os.path.exists(events):
            with open(events) as stream:
                self.events = [json.loads(line) for line in stream if line.strip()]
        shutil.rmtree(self.folder, ignore_errors=True)

    def of(self, kind):
        return [event for event in self.events if event.get("event") == kind]

    def checksums(self):
        """{rank: (world, checksum)} of the processes that finished the training."""
        return {int(r): (int(w), c) for r, w, _s, c in CHECKSUM.findall(self.output)}

    def steps(self):
        """{rank: steps the process trained}."""
        return {int(r): int(s) for r, _w, s, _c in CHECKSUM.findall(self.output)}

    def describe(self):
        return "exit %s\n%s" % (self.code, self.output[-6000:])


def example(flags, arguments=TRAINING, fault=None, transport=None, variables=None):
    return Job(flags, EXAMPLE, arguments, fault, transport, variables)


class Recovery(unittest.TestCase):
    """A kill -9 in each phase of a DDP step, recovered inside the surviving processes."""

    @classmethod
    def setUpClass(cls):
        cls.reference = example(["--nproc-per-node", "3"])

    def reference_checksum(self):
        job = self.reference
        self.assertEqual(job.code, 0, job.describe())
        sums = job.checksums()
        self.assertEqual(sorted(sums), [0, 1, 2], job.describe())
        self.assertEqual(len({c for _w, c in sums.values()}), 1, job.describe())
        return sums[0][1]

    def assert_killed(self, job, point):
        """The rule fired in rank 1 at that point, and the process really died of it."""
        faults = job.of("fault")
        self.assertEqual([(f["uid"], f["point"], f["action"]) for f in faults],
                         [(1, point, "kill")], job.describe())
        deaths = [e for e in job.of("exit") if e["uid"] == 1]
        self.assertEqual([e.get("signal") for e in deaths], ["SIGKILL"], job.describe())

    def killed_job(self, policy, point, step):
        flags = ["--nproc-per-node", "3", "--on-failure", policy]
        if policy == "replace":
            flags += ["--spares", "1"]
        return example(flags, fault="kill@rank=1,step=%d,point=%s" % (step, point))

    def check_replace(self, point, step=6):
        expected = self.reference_checksum()
        job = self.killed_job("replace", point, step)
        self.assertEqual(job.code, 0, job.describe())
        self.assert_killed(job, point)
        recoveries = job.of("recovery")
        self.assertTrue(recoveries and recoveries[0]["replaced"] == 1, job.describe())
        sums = job.checksums()
        self.assertEqual(sorted(sums), [0, 1, 2], job.describe())
        # Bit-identical to the run without a failure, in every rank, the newcomer's too.
        for rank, (world, checksum) in sums.items():
            self.assertEqual((world, checksum), (3, expected), job.describe())

    def check_shrink(self, point, steps):
        job = self.killed_job("shrink", point, 6)
        self.assertEqual(job.code, 0, job.describe())
        self.assert_killed(job, point)
        recoveries = job.of("recovery")
        self.assertTrue(recoveries and recoveries[0]["new_world"] == 2, job.describe())
        sums = job.checksums()
        self.assertEqual(sorted(sums), [0, 1], job.describe())
        # The world the script sees followed the shrink; the survivors agree bit for bit.
        self.assertEqual({world for world, _c in sums.values()}, {2}, job.describe())
        self.assertEqual(len({c for _w, c in sums.values()}), 1, job.describe())
        # The sampler's shard followed the new world from the step after the shrink: of the
        # 960 samples of epoch 1, 96 a step went by before it, then 64 a step; epoch 2 is 15
        # steps of 2 x 32. Without that, each survivor would go on with 10 steps an epoch.
        self.assertEqual(job.steps(), {0: steps, 1: steps}, job.describe())

    def survivor_a_step_behind(self, policy):
        """Over tcp a ring allreduce can succeed at some ranks and fail at others: rank 0
        dies after its second send of step 6's gradient allreduce, ranks ahead commit the
        step, and rank 2 is left in it. The recovery gives rank 2 the committed state (step
        7's start), so the binding must take that state and end its step there: redoing step
        6's allreduce against the others' step 7 would train another model, silently. The
        job; its checks are the caller's."""
        flags = ["--nproc-per-node", "3", "--on-failure", policy]
        if policy == "replace":
            flags += ["--spares", "1"]
        job = example(flags, fault="kill@rank=0,step=6,point=allreduce,after=2", transport="tcp")
        self.assertEqual(job.code, 0, job.describe())
        # The split happened: a survivor (not a spare) was given state, and it said so.
        survivors_given = [t["to"] for r in job.of("recovery") for t in r["transfers"]
                           if t["to"] < 3]
        self.assertTrue(survivors_given, job.describe())
        adopted = job.of("step_adopted")
        self.assertEqual([(e["uid"], e["from_step"], e["step"]) for e in adopted],
                         [(survivors_given[0], 6, 7)], job.describe())
        return job

    def test_replace_a_survivor_a_step_behind(self):
        expected = self.reference_checksum()
        job = self.survivor_a_step_behind("replace")
        sums = job.checksums()
        self.assertEqual(sorted(sums), [0, 1, 2], job.describe())
        for rank, (world, checksum) in sums.items():
            self.assertEqual((world, checksum), (3, expected), job.describe())

    def test_shrink_a_survivor_a_step_behind(self):
        # Both survivors go on in a world of 2 with the same model and the same batches: the
        # one behind keeps the old world's shard for its next batch, as the other did.
        job = self.survivor_a_step_behind("shrink")
        sums = job.checksums()
        self.assertEqual(sorted(sums), [0, 1], job.describe())
        self.assertEqual({world for world, _c in sums.values()}, {2}, job.describe())
        self.assertEqual(len({c for _w, c in sums.values()}), 1, job.describe())
        self.assertEqual(len(set(job.steps().values())), 1, job.describe())

    def test_replace_kill_in_forward(self):
        """At the first step of the second epoch: the newcomer's loop passes the finished
        epoch, and its random state comes back after its DataLoader drew a seed."""
        self.check_replace("forward", 10)

    def test_replace_kill_in_backward(self):
        self.check_replace("backward")

    def test_replace_kill_in_optimizer(self):
        self.check_replace("optimizer")

    def test_shrink_kill_in_forward(self):
        self.check_shrink("forward", 7 + 5 + 15)  # step 6 is the last in the old world

    def test_shrink_kill_in_backward(self):
        self.check_shrink("backward", 7 + 5 + 15)

    def test_shrink_kill_in_optimizer(self):
        self.check_shrink("optimizer", 8 + 3 + 15)  # the failure is seen in step 7

    def test_jit_restart_restores_the_registered_tensors(self):
        expected = self.reference_checksum()
        job = example(["--nproc-per-node", "3", "--ckpt", "jit"],
                      fault="kill@rank=1,step=6,point=backward")
        self.assertEqual(job.code, 0, job.describe())
        self.assert_killed(job, "backward")
        self.assertEqual(len(job.of("restart")), 1, job.describe())
        self.assertEqual(len(job.of("jit_save")), 2, job.describe())
        restores = job.of("jit_restore")
        self.assertEqual(len(restores), 3, job.describe())
        sums = job.checksums()
        self.assertEqual(sorted(sums), [0, 1, 2], job.describe())
        self.assertEqual({c for _w, c in sums.values()}, {expected}, job.describe())

    def test_replacement_after_the_bucket_rebuild(self):
        """DDP rebuilds its buckets after the first step; a newcomer starts with the initial
        layout. The layouts really differ (events), and the run still ends bit-identical."""
        arguments = ["--train-samples", "640", "--test-samples", "100", "--hidden", "1024",
                     "--bucket-cap-mb", "0.1"]
        reference = example(["--nproc-per-node", "2"], arguments)
        self.assertEqual(reference.code, 0, reference.describe())
        expected = reference.checksums()[0][1]
        job = example(["--nproc-per-node", "2", "--spares", "1", "--on-failure", "replace"],
                      arguments, fault="kill@rank=1,step=4,point=backward")
        self.assertEqual(job.code, 0, job.describe())
        self.assert_killed(job, "backward")
        layouts = job.of("ddp_buckets")
        survivor = [e["sizes"] for e in layouts if e["uid"] == 0]
        newcomer = [e["sizes"] for e in layouts if e["uid"] == 2]
        self.assertEqual(len(survivor), 2, job.describe())  # initial, then rebuilt at step 1
        self.assertTrue(newcomer and newcomer[0] == survivor[0], job.describe())
        self.assertNotEqual(newcomer[0], survivor[-1], job.describe())
        sums = job.checksums()
        self.assertEqual(sorted(sums), [0, 1], job.describe())
        self.assertEqual({c for _w, c in sums.values()}, {expected}, job.describe())


class Api(unittest.TestCase):
    """The backend's calls, its refusals and its messages."""

    def script(self, name, flags=("--nproc-per-node", "2"), fault=None):
        return Job(list(flags) + ["--collective-timeout", "20s"],
                   os.path.join(SCRIPTS, name), fault=fault)

    def test_collectives(self):
        job = self.script("torch_collectives.py", ("--nproc-per-node", "3"))
        self.assertEqual(job.code, 0, job.describe())
        self.assertEqual(sorted(re.findall(r"collectives ok rank (\d) of 3", job.output)),
                         ["0", "1", "2"], job.describe())

    def test_unsupported_calls_raise_naming_what(self):
        job = self.script("torch_unsupported.py")
        self.assertEqual(job.code, 0, job.describe())
        self.assertNotIn("NOT REFUSED", job.output)
        expected = {"new_group": "new_group", "meta tensor": "META tensor",
                    "float16": "torch.float16", "uint8": "torch.uint8",
                    "product": "ReduceOp.PRODUCT", "min": "ReduceOp.MIN", "reduce": "reduce is",
                    "gather": "gather is", "scatter": "scatter is",
                    "all_to_all": "all_to_all is", "send": "send is", "recv": "recv is",
                    "sparse": "sparse tensor", "optimizer": "optimizer RMSprop",
                    "sampler": "DistributedSampler"}
        for call, words in expected.items():
            lines = re.findall(r"unsupported %s: (.*)" % re.escape(call), job.output)
            self.assertEqual(len(lines), 2, "%s\n%s" % (call, job.describe()))
            self.assertIn(words, lines[0], job.describe())
        self.assertEqual(job.output.count("still working: [2.0, 2.0, 2.0, 2.0]"), 2,
                         job.describe())

    def test_script_without_init_is_told(self):
        job = self.script("torch_no_init.py")
        self.assertNotEqual(job.code, 0, job.describe())
        self.assertIn("never called keel.torch.init()", job.output)

    def test_failure_is_an_exception_when_recovery_is_off(self):
        job = self.script("torch_recovery_off.py", fault="kill@rank=1,point=backward")
        self.assertEqual(job.code, 0, job.describe())
        self.assertIn("caught CollectiveError at step 0, parameters unchanged: True",
                      job.output, job.describe())
        self.assertIn("KEEL_EPROCFAILED", job.output)

    def test_finish_checksum_is_the_models(self):
        """With KEEL_FINISH_CRC=1 (as keel chaos sets it) each rank's `finish` event carries
        a crc32c of the model as its last commit left it: the same in every replica and in
        every run. It used to be taken over a buffer packed at failures only, and over
        Python's and numpy's generators, which each process seeds for itself."""
        crcs = []
        for _run in range(2):
            job = example(["--nproc-per-node", "2"], variables={"KEEL_FINISH_CRC": "1"})
            self.assertEqual(job.code, 0, job.describe())
            finishes = job.of("finish")
            self.assertEqual(sorted(f["rank"] for f in finishes), [0, 1], job.describe())
            crcs.append({f["state_crc32c"] for f in finishes})
        self.assertEqual(len(crcs[0]), 1, crcs)
        self.assertEqual(crcs[0], crcs[1])

    def test_verify_replicas_is_refused(self):
        """--verify-replicas rolls the registered buffers back, which the binding does not
        unpack: refused at register, in words, rather than served wrong."""
        job = example(["--nproc-per-node", "2", "--verify-replicas", "every=10"])
        self.assertNotEqual(job.code, 0, job.describe())
        self.assertIn("--verify-replicas is not supported", job.output)

    def test_alone_without_launcher(self):
        """Without `keel run` the same script is a world of one."""
        environment = dict(os.environ, PYTHONPATH=os.path.join(SOURCE, "python"))
        result = subprocess.run([sys.executable, EXAMPLE] + TRAINING[:4], env=environment,
                                capture_output=True, text=True, timeout=JOB_SECONDS)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertRegex(result.stdout, r"rank 0 world 1 steps 30 ")

    def test_random_streams_travel_whole(self):
        """torch's, Python's and numpy's generators come back exactly as captured."""
        import random
        import numpy
        import keel.torch

        def draw():
            return (random.random(), random.gauss(0, 1), numpy.random.rand(),
                    numpy.random.randn(), torch.rand(2).tolist())
        random.seed(5)
        numpy.random.seed(7)
        torch.manual_seed(9)
        random.gauss(0, 1)  # a cached Gaussian in both generators
        numpy.random.randn()
        state = keel.torch._rng_capture()
        expected = draw()
        random.seed(1)
        numpy.random.seed(1)
        torch.manual_seed(1)
        self.assertNotEqual(draw(), expected)
        keel.torch._rng_restore(state)
        self.assertEqual(draw(), expected)

    def test_launcher_flags(self):
        from keel.torch import __main__ as launcher
        self.assertEqual(launcher.split(["--nproc_per_node", "4", "--standalone", "--agents",
                                         "t.py", "--lr", "1"]),
                         (["--nproc-per-node", "4", "--agents"], ["t.py", "--lr", "1"]))
        self.assertEqual(launcher.split(["--spares=1", "--", "-weird.py"]),
                         (["--spares=1"], ["-weird.py"]))
        self.assertEqual(launcher.main([]), 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
