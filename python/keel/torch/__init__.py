"""keel.torch: keel as a torch.distributed backend, with recovery inside the processes.

Three lines in a DDP script:

    keel.torch.init()                                   # process group, backend "keel"
    model = keel.torch.DistributedDataParallel(model)   # or the stock DDP
    keel.torch.register(model, optimizer, sampler)      # the state a newcomer receives

A training step is a keel step transaction: it begins at the model's forward, its gradient
reduction is one allreduce of every gradient in parameter order (whatever DDP's buckets),
and it commits after optimizer.step(). When a rank dies, the survivors recover inside the
same processes: under shrink the reduction is redone in the smaller world; under replace a
spare receives the step's starting state, computes the lost rank's gradient, and the
survivors redo the step's collectives with it, so the run ends bit-identical to one without
the failure. docs/PYTORCH.md says what is supported and what is not.
"""
import atexit
import math
import os
import random
import sys
import time

import numpy

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

import keel

BACKEND = "keel"

_DTYPES = {torch.float32: keel.F32, torch.float64: keel.F64, torch.int32: keel.I32,
           torch.int64: keel.I64, torch.bfloat16: keel.BF16}


class UnsupportedError(NotImplementedError):
    """A call keel.torch does not serve (the message names it). Never a hang, never wrong data."""


class CollectiveError(RuntimeError):
    """A collective failed and was not recovered (recovery off, or outside a step).
    .status is the keel status."""

    def __init__(self, what, status):
        self.status = status
        super().__init__("keel.torch: %s failed: %s (%s)" % (what, keel.strerror(status),
                                                            keel.status_name(status)))


class JobEnd(SystemExit):
    """This process's part in the job is over (a spare never used, a process declared dead,
    a restart, a stop): the script should end with .code, which `python3 -m keel.torch`
    does. A SystemExit, so that a script's `except Exception` does not swallow it."""

    def __init__(self, what, status):
        self.status = status
        self.what = what
        super().__init__(keel.exit_code(status))


_runtime = None


def _runtime_or_raise(call):
    if _runtime is None:
        raise RuntimeError("keel.torch.%s: call keel.torch.init() first" % call)
    return _runtime


def initialized():
    return _runtime is not None


def init(recovery=True):
    """Joins the job (from the environment `keel run` sets; alone, a world of one) and makes
    the default process group with backend "keel". recovery=False: a failed collective
    raises CollectiveError instead of being recovered. Returns the process group."""
    global _runtime
    if _runtime is not None:
        raise RuntimeError("keel.torch.init() was already called")
    if dist.is_initialized():
        raise RuntimeError("keel.torch.init(): torch.distributed is already initialized "
                           "(call keel.torch.init() instead of init_process_group)")
    _runtime = _Runtime(keel.Context(), recovery)
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _make_group)
    # A spare has no rank yet: torch gets rank 0 of the initial world until it takes one.
    world = _runtime.size() or int(os.environ.get("KEEL_WORLD", "1"))
    _runtime.initializing = True
    try:
        dist.init_process_group(BACKEND, rank=max(_runtime.rank(), 0), world_size=world,
                                store=dist.HashStore())
    finally:
        _runtime.initializing = False
    # torch's new_group makes the processes outside the new group wait in a store barrier
    # (30 minutes by default) that, in keel's process-local store, no one would complete:
    # it is refused in every process instead, at once.
    dist.new_group = dist.distributed_c10d.new_group = _new_group_refused
    atexit.register(shutdown)
    return _runtime.group


def _new_group_refused(*_arguments, **_keywords):
    raise UnsupportedError("keel.torch: new_group is not supported: keel has one group, the "
                           "world of the job")


def shutdown():
    """Leaves the job in order (keel_finalize). Idempotent; runs at exit by itself."""
    if _runtime is not None:
        _runtime.context.finalize()


def DistributedDataParallel(module, *arguments, **keywords):
    """torch's DistributedDataParallel on the keel group, with keel's gradient reduction."""
    runtime = _runtime_or_raise("DistributedDataParallel")
    model = torch.nn.parallel.DistributedDataParallel(module, *arguments, **keywords)
    runtime.attach(model)
    return model


def register(model, optimizer, sampler=None):
    """Registers the training state (parameters, buffers, optimizer state, the sampler's
    position, the RNG state, the step) and starts: a worker returns at once; a spare waits
    here until it takes a failed rank's place, and returns holding that rank's state."""
    _runtime_or_raise("register").register(model, optimizer, sampler)


def _make_group(store, rank, size, timeout):
    runtime = _runtime_or_raise("init")
    if runtime.group is not None:
        _new_group_refused()
    runtime.group = ProcessGroup(runtime, rank, size)
    return runtime.group


def _ending(status):
    return status in keel.ENDING


def _check_cpu(tensors, call, reduction):
    if len(tensors) != 1:
        raise UnsupportedError("keel.torch: %s of %d tensors in one call is not supported "
                               "(one tensor per call)" % (call, len(tensors)))
    tensor = tensors[0]
    if tensor.device.type != "cpu":
        raise UnsupportedError("keel.torch: %s of a %s tensor is not supported: keel reduces "
                               "CPU tensors" % (call, tensor.device.type.upper()))
    if tensor.is_sparse:
        raise UnsupportedError("keel.torch: %s of a sparse tensor is not supported" % call)
    if reduction and tensor.dtype not in _DTYPES:
        raise UnsupportedError("keel.torch: %s of %s is not supported (float32, float64, "
                               "int32, int64, bfloat16)" % (call, tensor.dtype))
    return tensor


def _reduce_op(opts, call):
    op = opts.reduceOp
    for name, code in (("SUM", keel.SUM), ("AVG", keel.AVG), ("MAX", keel.MAX)):
        if hasattr(dist.ReduceOp, name) and op == getattr(dist.ReduceOp, name):
            return code
    names = [name for name in ("PRODUCT", "MIN", "BAND", "BOR", "BXOR", "PREMUL_SUM")
             if hasattr(dist.ReduceOp, name) and op == getattr(dist.ReduceOp, name)]
    raise UnsupportedError("keel.torch: %s with ReduceOp.%s is not supported (SUM, AVG, MAX)"
                           % (call, names[0] if names else op))


def _completed(result):
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


class _Collective:
    """One collective of a step: run(in_step) sends from private copies of its inputs, so
    that a redo after a recovery sends exactly what the first try did; finish() hands the
    result to the caller's tensors once it succeeded."""

    def __init__(self, name, run, finish=None):
        self.name = name
        self.run = run
        self.finish = finish


class ProcessGroup(dist.ProcessGroup):
    """The "keel" backend: the world of the job, which changes with every recovery."""

    def __init__(self, runtime, rank, size):
        super().__init__(rank, size)
        self._runtime = runtime
        self._local_only = 0

    # The world follows recoveries: dist.get_rank() / get_world_size() read it live.
    def rank(self):
        return max(self._runtime.rank(), 0)

    def size(self):
        # keel_init already met every worker. torch's init_process_group then waits in its
        # store for world_size keys, but the store is this process's own: during that
        # barrier the group says 1, so that this process's key completes it.
        if self._runtime.initializing:
            return 1
        return self._runtime.size() or 1

    def getBackendName(self):
        return BACKEND

    def _is_local(self):
        """Collectives of a process that holds no rank yet (a spare before it takes one),
        and the bucket order DDP broadcasts when it rebuilds its buckets, stay in this
        process: keel's reduction does not depend on the buckets, so every process may keep
        its own order, and a newcomer's rebuild (late, alone) then needs no partner."""
        return not self._runtime.started or self._local_only > 0

    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        tensor = _check_cpu(tensors, "allreduce", True)
        op = _reduce_op(opts, "allreduce")
        if self._is_local():
            return _completed(tensors)
        self._reduction("allreduce", self._runtime.context.allreduce,
                        tensor.detach().contiguous().clone(), tensor.numel(), op, tensor)
        return _completed(tensors)

    def _reduction(self, name, function, send, count, op, output):
        """allreduce and reduce_scatter: send (a private copy) reduced into count elements
        that end in output."""
        receive = torch.empty(count, dtype=output.dtype)
        dtype = _DTYPES[output.dtype]
        self._runtime.collective(_Collective(
            name,
            lambda in_step: function(in_step, send.data_ptr(), receive.data_ptr(), count, dtype,
                                     op),
            lambda: output.copy_(receive.view_as(output))))

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        tensor = _check_cpu(tensors, "broadcast", False)
        if self._is_local():
            return _completed(tensors)
        original = tensor.detach().contiguous().clone()
        root = opts.rootRank

        def run(in_step):
            buffer = original.clone()
            status = self._runtime.context.broadcast(
                in_step, buffer.data_ptr(), buffer.numel() * buffer.element_size(), root)
            run.result = buffer
            return status
        self._runtime.collective(_Collective(
            "broadcast", run, lambda: tensor.copy_(run.result.view_as(tensor))))
        return _completed(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        tensor = _check_cpu(input_tensors, "allgather", False)
        if len(output_tensors) != 1:
            raise UnsupportedError("keel.torch: allgather of several tensor lists is not "
                                   "supported (one tensor per call)")
        outputs = output_tensors[0]
        if self._is_local():
            for output in outputs:
                output.copy_(tensor)
            return _completed(output_tensors)
        size = self.size()
        if len(outputs) != size:
            raise ValueError("keel.torch: allgather needs %d output tensors, got %d"
                             % (size, len(outputs)))
        self._gather(tensor, lambda receive: [output.copy_(block.view_as(output)) for output, block
                                              in zip(outputs, receive.chunk(size))])
        return _completed(output_tensors)

    def _allgather_base(self, output, input, opts=None):
        tensor = _check_cpu([input], "allgather", False)
        if self._is_local():
            for block in output.view(-1).chunk(output.numel() // max(tensor.numel(), 1)):
                block.copy_(tensor.view(-1))
            return _completed([output])
        if output.numel() != tensor.numel() * self.size():
            raise ValueError("keel.torch: all_gather_into_tensor needs %d elements in the output"
                             % (tensor.numel() * self.size()))
        self._gather(tensor, lambda receive: output.copy_(receive.view_as(output)))
        return _completed([output])

    def _gather(self, tensor, finish):
        send = tensor.detach().contiguous().clone()
        bytes_per_rank = send.numel() * send.element_size()

        def run(in_step):
            run.receive = torch.empty(send.numel() * self.size(), dtype=send.dtype)
            return self._runtime.context.allgather(in_step, send.data_ptr(),
                                                   run.receive.data_ptr(), bytes_per_rank)
        self._runtime.collective(_Collective("allgather", run, lambda: finish(run.receive)))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        output = _check_cpu(output_tensors, "reduce_scatter", True)
        if len(input_tensors) != 1:
            raise UnsupportedError("keel.torch: reduce_scatter of several tensor lists is not "
                                   "supported (one tensor per call)")
        op = _reduce_op(opts, "reduce_scatter")
        inputs = input_tensors[0]
        if self._is_local():
            output.copy_(inputs[0])
            return _completed(output_tensors)
        if len(inputs) != self.size() or any(i.numel() != output.numel() for i in inputs):
            raise ValueError("keel.torch: reduce_scatter needs %d inputs shaped like the output"
                             % self.size())
        send = torch.cat([i.detach().reshape(-1) for i in inputs]).to(output.dtype)
        self._reduction("reduce_scatter", self._runtime.context.reduce_scatter, send,
                        output.numel(), op, output)
        return _completed(output_tensors)

    def barrier(self, opts=None):
        if self._is_local():
            return _completed([])
        # Inside a step a barrier is a recoverable allreduce of nothing much.
        token = torch.zeros(1, dtype=torch.int32)
        receive = torch.empty_like(token)
        self._runtime.collective(_Collective(
            "barrier",
            lambda in_step: (self._runtime.context.allreduce(
                in_step, token.data_ptr(), receive.data_ptr(), 1, keel.I32, keel.SUM)
                if in_step else self._runtime.context.barrier())))
        return _completed([])


def _refusal(call):
    def refuse(self, *_arguments, **_keywords):
        raise UnsupportedError("keel.torch: %s is not supported (allreduce, broadcast, "
                               "allgather, reduce_scatter and barrier are)" % call)
    return refuse


# The ProcessGroup methods torch.distributed calls for what keel does not serve, and the
# names a user knows them by.
for _method, _call in (("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"),
                       ("alltoall", "all_to_all"), ("alltoall_base", "all_to_all_single"),
                       ("send", "send"), ("recv", "recv"),
                       ("recv_anysource", "recv from any source"),
                       ("allreduce_coalesced", "all_reduce_coalesced"),
                       ("allgather_coalesced", "all_gather_coalesced"),
                       ("_reduce_scatter_base", "reduce_scatter_tensor")):
    setattr(ProcessGroup, _method, _refusal(_call))


class _ReducerProxy:
    """DDP's reducer, but its bucket rebuild broadcasts nothing (ProcessGroup._is_local)."""

    def __init__(self, reducer, group):
        object.__setattr__(self, "_reducer", reducer)
        object.__setattr__(self, "_group", group)

    def __getattr__(self, name):
        return getattr(self._reducer, name)

    def _rebuild_buckets(self):
        self._group._local_only += 1
        try:
            return self._reducer._rebuild_buckets()
        finally:
            self._group._local_only -= 1


def _optimizer_state_create(optimizer):
    """Makes the optimizer state that torch creates lazily at the first step, so that it is
    registered (same sizes everywhere) before any step. Only optimizers whose lazy state is
    known here are accepted: anything else would leave a newcomer without it."""
    name = type(optimizer).__name__
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            state = optimizer.state[parameter]
            if state:
                continue
            if name in ("Adam", "AdamW"):
                state["step"] = torch.zeros(())
                state["exp_avg"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(parameter,
                                                       memory_format=torch.preserve_format)
                if group.get("amsgrad"):
                    state["max_exp_avg_sq"] = torch.zeros_like(
                        parameter, memory_format=torch.preserve_format)
            elif name == "SGD":
                # A zero momentum buffer gives the stock first step exactly when dampening
                # is 0 (0 * momentum + gradient).
                if group.get("momentum", 0) != 0:
                    state["momentum_buffer"] = torch.zeros_like(parameter)
            else:
                raise UnsupportedError("keel.torch.register: optimizer %s is not supported "
                                       "(SGD, Adam, AdamW)" % name)


_TORCH_RNG_BYTES = torch.get_rng_state().numel()
_MERSENNE_WORDS = 624


def _rng_capture():
    """The random streams a step may draw from, at the step's start, in one byte tensor:
    torch's CPU generator, Python's `random` and numpy's global generator (Mersenne
    Twisters: 624 words, a position, and a cached Gaussian)."""
    version, python_state, python_gauss = random.getstate()
    numpy_name, numpy_words, numpy_position, numpy_has_gauss, numpy_gauss = \
        numpy.random.get_state()
    words = numpy.empty(2 * _MERSENNE_WORDS + 4, dtype=numpy.int64)
    words[:_MERSENNE_WORDS + 1] = python_state
    words[_MERSENNE_WORDS + 1] = python_gauss is not None
    words[_MERSENNE_WORDS + 2:2 * _MERSENNE_WORDS + 2] = numpy_words
    words[2 * _MERSENNE_WORDS + 2] = numpy_position
    words[2 * _MERSENNE_WORDS + 3] = numpy_has_gauss
    gaussians = numpy.array([python_gauss or 0.0, numpy_gauss], dtype=numpy.float64)
    return torch.cat([torch.get_rng_state(), torch.from_numpy(words.view(numpy.uint8)),
                      torch.from_numpy(gaussians.view(numpy.uint8))])


def _rng_restore(state):
    torch.set_rng_state(state[:_TORCH_RNG_BYTES].clone())
    rest = state[_TORCH_RNG_BYTES:].numpy()
    words = rest[:(2 * _MERSENNE_WORDS + 4) * 8].view(numpy.int64)
    gaussians = rest[(2 * _MERSENNE_WORDS + 4) * 8:].view(numpy.float64)
    python_gauss = float(gaussians[0]) if words[_MERSENNE_WORDS + 1] else None
    random.setstate((3, tuple(int(w) for w in words[:_MERSENNE_WORDS + 1]), python_gauss))
    numpy.random.set_state(("MT19937", words[_MERSENNE_WORDS + 2:2 * _MERSENNE_WORDS + 2]
                            .astype(numpy.uint32), int(words[2 * _MERSENNE_WORDS + 2]),
                            int(words[2 * _MERSENNE_WORDS + 3]), float(gaussians[1])))


class _Runtime:
    """The process's side of the binding: the keel context, the open step and its journal
    of collectives, the gradient reduction, and the registered state packed for transfer."""

    def __init__(self, context, recovery):
        self.context = context
        self.recovery = recovery
        self.group = None
        role = os.environ.get("KEEL_ROLE", "worker")
        self.started = role not in ("spare", "joiner")
        self.registered = False
        self.initializing = False
        self.model = None
        # The step transaction.
        self.step = 0
        self.step_open = False
        self.journal = []
        self.batch_samples = 0
        self.iteration_world = 0
        self.committed_ns = 0
        # The registered buffer is packed when a failure needs it. A tool that asked for the
        # final state's checksum (KEEL_FINISH_CRC, set by `keel chaos`), taken at each commit,
        # needs it packed at each commit too, or it reads a stale buffer.
        self.pack_at_commit = os.environ.get("KEEL_FINISH_CRC") == "1"
        # The gradient reduction (set by attach).
        self.offsets = None
        self.total = 0
        self.covered = 0
        self.pending = []
        self.deferred = None
        # The job did this iteration's step while this process was a step behind: its state
        # arrived (_adopt_received), and the iteration ends without communicating or updating.
        self.adopted = False
        self.recoveries_seen = 0
        # After an adopted step the next batch keeps the old world's shard, as the batch of
        # the step the others redid did: the shard follows the new world from the one after.
        self.shard_held = False
        self.layout = []
        self.reported_layout = None
        # The sampler's position: (epoch, global samples consumed in it).
        self.sampler = None
        self.epoch = 0
        self.consumed = 0
        self.skip_epoch = False
        self.rng_pending = False

    def rank(self):
        return self.context.rank() if self.started else -1

    def size(self):
        return self.context.size() if self.started else 0

    # ---- collectives and the step journal

    def collective(self, operation):
        in_step = self.recovery and self.step_open
        if self.adopted:
            return  # the iteration was done by the job: nothing of it is sent again
        status = operation.run(in_step)
        while in_step and status == keel.EREDO:
            if self._adopt_received() or self._redo():
                return
            status = operation.run(True)
        if status != keel.OK:
            self._raise(operation.name, status)
        if operation.finish is not None:
            operation.finish()
        if in_step:
            self.journal.append(operation)

    def _adopt_received(self):
        """After a recovery that replaced this process's registered state with a survivor's:
        the tensors take it back. When it is of a later step than the one in progress, this
        process was a step behind (its collective failed after the others had the result and
        committed the step), so the job has done this step: it ends here, and neither the
        collectives sent again nor the optimizer's update may happen. True in that case."""
        recovery = self.context.last_recovery()
        if recovery.count == self.recoveries_seen:
            return False
        self.recoveries_seen = recovery.count
        if not recovery.state_received:
            return False
        in_progress = self.step
        self._unpack(mid_pass=True)
        if self.step <= in_progress:
            return False  # the same step's starting state: the step begins again
        self.context.report_event("step_adopted", '"step":%d,"from_step":%d'
                                  % (self.step, in_progress))
        self.step_open = False
        self.journal = []
        self.adopted = True
        self.shard_held = True
        return True

    def _redo(self):
        """The runtime recovered and the step begins again: the collectives already done in
        it are sent again, with the same inputs, for the newcomer that does the step anew.
        True when a recovery meanwhile gave this process a later step's state instead."""
        while True:
            status = self.context.step_begin(self.step)
            if status != keel.OK:
                self._raise("keel_step_begin", status)
            for operation in self.journal:
                status = operation.run(True)
                if status != keel.OK:
                    break
            if status == keel.OK:
                return False
            if status != keel.EREDO:
                self._raise(operation.name, status)
            if self._adopt_received():
                return True

    def _raise(self, what, status):
        if _ending(status):
            raise JobEnd(what, status)
        raise CollectiveError(what, status)

    # ---- the step: forward begins it, optimizer.step() commits it

    def _raise_deferred(self):
        error, self.deferred = self.deferred, None
        if error is not None:
            self.step_open = False
            raise error

    def _forward_pre_hook(self, module, inputs):
        self._raise_deferred()
        if not torch.is_grad_enabled():
            return
        self.adopted = False  # a new iteration
        if not self.registered:
            raise RuntimeError("keel.torch: call keel.torch.register(model, optimizer, sampler) "
                               "before the first training step")
        if not self.step_open:
            self._begin()
        first = next((i for i in inputs if isinstance(i, torch.Tensor)), None)
        self.batch_samples += int(first.shape[0]) if first is not None and first.dim() else 0

    def _begin(self):
        # Without recovery a step is only bookkeeping (the sampler's position, fault points).
        status = self.context.step_begin(self.step) if self.recovery else keel.OK
        if status != keel.OK:
            self._raise("keel_step_begin", status)
        self.step_open = True
        self.journal = []
        self.batch_samples = 0
        self.context.fault_point("forward")

    def _optimizer_step(self, original, arguments, keywords):
        self._raise_deferred()
        if self.adopted:
            return None  # the state received holds this step's update already
        if self.step_open:
            self.context.fault_point("optimizer")
        result = original(*arguments, **keywords)
        if self.step_open:
            self._commit()
        return result

    def _commit(self):
        self.step += 1
        self.shard_held = False
        if not self.skip_epoch:
            self.consumed += self.batch_samples * (self.iteration_world or self.size())
        self.rng_state = _rng_capture()
        self.step_open = False
        self.journal = []
        if self.pack_at_commit:
            self._pack()
        status = self.context.step_commit() if self.recovery else keel.OK
        if status != keel.OK:
            self._raise("keel_step_commit", status)
        self._progress_report()

    def _progress_report(self):
        """A progress event, as a C program writes it with keel_report (at most one each
        100 ms): the step and the samples per second, so that `keel status` and `keel chaos`
        see the job train. The loss is the script's: not known here."""
        now = time.monotonic_ns()
        elapsed = now - self.committed_ns if self.committed_ns else 0
        samples = self.batch_samples * (self.iteration_world or self.size())
        self.committed_ns = now
        self.context.report(self.step, math.nan, samples * 1e9 / elapsed if elapsed else math.nan)

    # ---- the gradient reduction: one allreduce of every gradient, in parameter order

    def attach(self, model):
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise TypeError("keel.torch: expected a DistributedDataParallel model, got %s"
                            % type(model).__name__)
        if self.model is model:
            return
        if self.model is not None:
            raise UnsupportedError("keel.torch: one DistributedDataParallel model per process")
        if model.process_group is not self.group:
            raise UnsupportedError("keel.torch: the model's process group is not keel's "
                                   "(build DDP after keel.torch.init(), without process_group=)")
        parameters = [p for p in model.module.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in parameters}
        if len(dtypes) != 1 or next(iter(dtypes)) not in _DTYPES:
            raise UnsupportedError("keel.torch: parameters of one dtype among float32, float64, "
                                   "bfloat16 are supported, not %s" % sorted(map(str, dtypes)))
        self.offsets = {}
        for parameter in parameters:
            self.offsets[parameter.data_ptr()] = (self.total, parameter.numel())
            self.total += parameter.numel()
        dtype = parameters[0].dtype
        self.gradient_dtype = _DTYPES[dtype]
        self.gradients_send = torch.empty(self.total, dtype=dtype)
        self.gradients_receive = torch.empty(self.total, dtype=dtype)
        model.register_comm_hook(None, self._gradient_hook)
        model.reducer = _ReducerProxy(model.reducer, self.group)
        model.register_forward_pre_hook(self._forward_pre_hook)
        self.model = model

    def _gradient_hook(self, _state, bucket):
        future = torch.futures.Future()
        for parameter, gradient in zip(bucket.parameters(), bucket.gradients()):
            offset, count = self.offsets[parameter.data_ptr()]
            self.gradients_send[offset:offset + count].copy_(gradient.reshape(-1))
            self.covered += count
        self.pending.append((future, bucket))
        self.layout.append(bucket.buffer().numel())
        if self.covered == self.total:
            self._reduce_gradients()
        return future

    def _reduce_gradients(self):
        pending, self.pending, self.covered = self.pending, [], 0
        self._layout_report()
        try:
            if not self.step_open and not self.adopted:
                self._begin()
            self.context.fault_point("backward")
            send, receive = self.gradients_send, self.gradients_receive
            self.collective(_Collective(
                "gradient allreduce",
                lambda in_step: self.context.allreduce(in_step, send.data_ptr(),
                                                       receive.data_ptr(), self.total,
                                                       self.gradient_dtype, keel.SUM)))
        except BaseException as error:
            # An exception out of a communication hook reaches the script as a bare
            # RuntimeError (torch's reducer converts it), which would lose JobEnd's exit
            # code and CollectiveError's type. So backward ends with the gradients
            # unreduced, and optimizer.step() raises the error before it applies them.
            self.deferred = error
            for future, bucket in pending:
                future.set_result(bucket.buffer())
            return
        # The sum over the world that did the step (smaller after a shrink), then the mean.
        receive.div_(self.size())
        for future, bucket in pending:
            for parameter, gradient in zip(bucket.parameters(), bucket.gradients()):
                offset, count = self.offsets[parameter.data_ptr()]
                gradient.view(-1).copy_(receive[offset:offset + count])
            future.set_result(bucket.buffer())

    def _layout_report(self):
        """An event each time this process's bucket layout changes (DDP rebuilds after the
        first step; a newcomer starts with the initial one): what shows that the reduction
        did not depend on it."""
        layout, self.layout = self.layout, []
        if layout != self.reported_layout:
            self.reported_layout = layout
            self.context.report_event("ddp_buckets", '"step":%d,"sizes":[%s]'
                                      % (self.step, ",".join(map(str, layout))))

    # ---- registration: what a newcomer receives, packed at a failure

    def register(self, model, optimizer, sampler):
        if self.registered:
            raise RuntimeError("keel.torch.register() was already called")
        if os.environ.get("KEEL_VERIFY_EVERY", "0") not in ("", "0"):
            raise UnsupportedError("keel.torch.register: --verify-replicas is not supported "
                                   "(its roll-back restores buffers the binding does not unpack)")
        self.attach(model)
        _optimizer_state_create(optimizer)
        self.tensors = list(model.module.parameters()) + list(model.module.buffers())
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                for key in sorted(optimizer.state[parameter]):
                    value = optimizer.state[parameter][key]
                    if isinstance(value, torch.Tensor):
                        self.tensors.append(value)
        for tensor in self.tensors:
            if tensor.device.type != "cpu" or not tensor.is_contiguous():
                raise UnsupportedError("keel.torch.register: state tensors must be contiguous "
                                       "CPU tensors")
        self.packed_bytes = sum(t.numel() * t.element_size() for t in self.tensors)
        self.packed = torch.empty(self.packed_bytes, dtype=torch.uint8)
        self.rng_state = _rng_capture()
        self.rng_buffer = self.rng_state.clone()
        self.progress = torch.zeros(3, dtype=torch.int64)  # step, epoch, consumed
        if sampler is not None:
            self._sampler_attach(sampler)
        for name, tensor in (("torch.state", self.packed), ("torch.rng", self.rng_buffer),
                             ("torch.progress", self.progress)):
            self.context.register(name, tensor.data_ptr(), tensor.numel() * tensor.element_size())
        # Python's and numpy's generators are seeded by each process for itself unless the
        # script seeds them: moved with the state, but no part of what replicas hold alike.
        self.context.mark_per_process("torch.rng")
        self.context.on_failure(self._pack_on_failure)
        optimizer_step = optimizer.step
        optimizer.step = lambda *a, **k: self._optimizer_step(optimizer_step, a, k)
        self.registered = True

        status = self.context.start()
        if status != keel.OK:
            self._raise("keel_start", status)
        self.started = True
        self.recoveries_seen = self.context.last_recovery().count
        restored = self.context.enable_jit()
        if self.context.is_newcomer() or restored:
            self._unpack()
        self.iteration_world = self.size()

    def _pack_on_failure(self, _cause, _step, _in_process):
        # Runs inside the runtime, before it sends or saves the registered state; the state
        # is the step's starting state (the optimizer has not run, or the step committed).
        try:
            self._pack()
        except BaseException as error:  # never into the C runtime
            sys.stderr.write("keel.torch: packing the state failed: %r\n" % (error,))

    def _pack(self):
        offset = 0
        for tensor in self.tensors:
            size = tensor.numel() * tensor.element_size()
            self.packed[offset:offset + size].copy_(tensor.detach().reshape(-1).view(torch.uint8))
            offset += size
        self.rng_buffer.copy_(self.rng_state)
        self.progress.copy_(torch.tensor([self.step, self.epoch, self.consumed]))

    def _unpack(self, mid_pass=False):
        offset = 0
        with torch.no_grad():
            for tensor in self.tensors:
                size = tensor.numel() * tensor.element_size()
                tensor.detach().reshape(-1).view(torch.uint8).copy_(
                    self.packed[offset:offset + size])
                offset += size
        self.rng_state = self.rng_buffer.clone()
        # With a sampler the random state goes back where the survivors took it: at the
        # first batch of the pass (_sampler_iteration_starts). A survivor that was a step
        # behind is mid-pass already: it takes it back at once.
        self.rng_pending = self.sampler is not None and not mid_pass
        if not self.rng_pending:
            _rng_restore(self.rng_state)
        self.step, self.epoch, self.consumed = (int(v) for v in self.progress.tolist())

    # ---- the sampler: its position is state, and its shard follows the world

    def _sampler_attach(self, sampler):
        if not isinstance(sampler, torch.utils.data.DistributedSampler):
            raise UnsupportedError("keel.torch.register: the sampler must be a "
                                   "torch.utils.data.DistributedSampler, not %s"
                                   % type(sampler).__name__)
        runtime = self

        class ResumableSampler(type(sampler)):
            def __iter__(self):
                runtime._sampler_iteration_starts(self)
                return runtime._sampler_stream(self)

            def __len__(self):
                return len(runtime._sampler_indices(self))

            def set_epoch(self, epoch):
                runtime._sampler_set_epoch(self, epoch)

        ResumableSampler.__name__ = "Resumable" + type(sampler).__name__
        sampler.__class__ = ResumableSampler
        self.sampler = sampler
        self.epoch = sampler.epoch
        self.iterated_epoch = None

    def _sampler_set_epoch(self, sampler, epoch):
        sampler.epoch = epoch
        # A newcomer's loop starts at epoch 0: the epochs the job already finished are empty.
        self.skip_epoch = epoch < self.epoch
        if epoch > self.epoch:
            self.epoch, self.consumed = epoch, 0

    def _sampler_iteration_starts(self, sampler):
        """The DataLoader asks for the first batch of a pass. It has just drawn its base
        seed from torch's generator, and the batch's samples (their augmentations) come
        next: the point every process reaches with the same random state, a newcomer too
        (whose own iterator's draw is thereby forgotten). So the state is taken here as well
        as at each commit, and a newcomer puts the received one back here."""
        if self.rng_pending:
            if sampler.epoch == self.epoch:
                _rng_restore(self.rng_state)
                self.rng_pending = False
        else:
            self.rng_state = _rng_capture()
        # A second pass over the same epoch without set_epoch: a new pass from the start.
        if self.iterated_epoch == sampler.epoch and not self._sampler_indices(sampler):
            self.consumed = 0
        self.iterated_epoch = sampler.epoch

    def _sampler_stream(self, sampler):
        """The pass's indices, one at a time: when a step commits in a world of another size
        (a shrink), the rest of the epoch is sharded anew over the new world, from the next
        batch on (the DataLoader draws a batch's indices when it needs the batch)."""
        while True:
            indices = self._sampler_indices(sampler)
            world = self.iteration_world
            for index in indices:
                if self.size() != world and not self.step_open and not self.shard_held:
                    break
                yield index
            else:
                return

    def _sampler_indices(self, sampler):
        """DistributedSampler's shard of the samples of this epoch not yet consumed, over the
        world of now: the same indices as the stock sampler in a job without failures, and
        none once the epoch is done."""
        if self.skip_epoch:
            return []
        count = len(sampler.dataset)
        if sampler.shuffle:
            generator = torch.Generator()
            generator.manual_seed(sampler.seed + self.epoch)
            order = torch.randperm(count, generator=generator).tolist()
        else:
            order = list(range(count))
        remaining = order[self.consumed:]
        world, rank = max(self.size(), 1), max(self.rank(), 0)
        if sampler.drop_last:
            remaining = remaining[:len(remaining) // world * world]
        elif remaining:
            padding = -len(remaining) % world
            remaining += (order * math.ceil(padding / max(len(order), 1)))[:padding]
        self.iteration_world = world
        return remaining[rank::world]
