"""keel for Python: libkeel.so through ctypes.

The process's membership in a keel job (keel_init .. keel_finalize), its state registry,
step transactions and collectives, as thin wrappers that turn every status into a return
value or an exception. keel.torch builds the PyTorch binding on top of this module.
"""
import ctypes

from keel import _library

ABI_VERSION = 2

# Status codes (include/keel/core.h) that callers branch on.
OK = 0
EINVAL = -1
ETIMEDOUT = -4
EPROCFAILED = -5
EREVOKED = -6
ENOTFOUND = -11
ENOTSUP = -19
EEXCLUDED = -18
EJOBDONE = -21
ERESTART = -22
EREDO = -23
ESTOPPED = -24
EORPHANED = -25

# keel_dtype and keel_reduce_op (include/keel/comm.h).
F32, F64, I32, I64, BF16 = 0, 1, 2, 3, 4
SUM, AVG, MAX = 0, 1, 2

# The statuses that end this process's part in the job: the script must leave with
# keel_exit_code(status) (0, 75, 76, 77), not carry on.
ENDING = (EEXCLUDED, EJOBDONE, ERESTART, ESTOPPED, EORPHANED)

_lib = _library.load()
_void_p = ctypes.c_void_p
_size_t = ctypes.c_size_t


def _declare(name, result, *arguments):
    function = getattr(_lib, name)
    function.restype = result
    function.argtypes = list(arguments)
    return function


_int = ctypes.c_int
_status = ctypes.c_int
_declare("keel_abi_version", _int)
_declare("keel_strerror", ctypes.c_char_p, _status)
_declare("keel_status_name", ctypes.c_char_p, _status)
_declare("keel_exit_code", _int, _status)
_declare("keel_init", _status, ctypes.POINTER(_void_p))
_declare("keel_finalize", None, _void_p)
_declare("keel_state_register", _status, _void_p, ctypes.c_char_p, _void_p, _size_t)
_declare("keel_state", _void_p, _void_p)
_declare("keel_registry_mark_per_process", _status, _void_p, ctypes.c_char_p)
_declare("keel_start", _status, _void_p)
_declare("keel_world", _void_p, _void_p)
_declare("keel_is_newcomer", ctypes.c_bool, _void_p)
_declare("keel_job_id", ctypes.c_uint64, _void_p)
_declare("keel_comm_rank", _int, _void_p)
_declare("keel_comm_size", _int, _void_p)
_declare("keel_step_begin", _status, _void_p, ctypes.c_uint64)
_declare("keel_step_commit", _status, _void_p)
_declare("keel_step_allreduce", _status, _void_p, _void_p, _void_p, _size_t, _int, _int)
_declare("keel_step_reduce_scatter", _status, _void_p, _void_p, _void_p, _size_t, _int, _int)
_declare("keel_step_allgather", _status, _void_p, _void_p, _void_p, _size_t)
_declare("keel_step_broadcast", _status, _void_p, _void_p, _size_t, _int)
_declare("keel_comm_allreduce", _status, _void_p, _void_p, _void_p, _size_t, _int, _int)
_declare("keel_comm_reduce_scatter", _status, _void_p, _void_p, _void_p, _size_t, _int, _int)
_declare("keel_comm_allgather", _status, _void_p, _void_p, _void_p, _size_t)
_declare("keel_comm_broadcast", _status, _void_p, _void_p, _size_t, _int)
_declare("keel_comm_barrier", _status, _void_p)
_declare("keel_fault_point", ctypes.c_bool, _void_p, ctypes.c_char_p)
_declare("keel_report", None, _void_p, ctypes.c_uint64, ctypes.c_double, ctypes.c_double)
_declare("keel_report_event", None, _void_p, ctypes.c_char_p, ctypes.c_char_p)
_declare("keel_ckpt_jit_enable", _status, _void_p, _void_p, ctypes.POINTER(_void_p))
_declare("keel_ckpt_jit_restored", ctypes.c_bool, _void_p, _void_p)
_declare("keel_ckpt_jit_destroy", None, _void_p)


class _Failure(ctypes.Structure):
    """keel_failure (include/keel/runtime.h)."""
    _fields_ = [("cause", ctypes.c_int), ("step", ctypes.c_uint64), ("step_known", ctypes.c_bool),
                ("epoch", ctypes.c_uint64), ("in_process", ctypes.c_bool),
                ("failed_ns", ctypes.c_int64)]


_FailureHook = ctypes.CFUNCTYPE(None, _void_p, ctypes.POINTER(_Failure))
_declare("keel_on_failure", _status, _void_p, _FailureHook, _void_p)


class Recovery(ctypes.Structure):
    """keel_recovery (include/keel/runtime.h): what the last recovery did; .count (set by
    Context.last_recovery) is how many this process has taken part in."""
    _fields_ = [("recovered", ctypes.c_bool), ("redo_step", ctypes.c_bool),
                ("state_received", ctypes.c_bool),
                ("old_epoch", ctypes.c_uint64), ("new_epoch", ctypes.c_uint64),
                ("old_size", ctypes.c_int), ("new_size", ctypes.c_int),
                ("failed_count", ctypes.c_int), ("replaced_count", ctypes.c_int),
                ("joined_count", ctypes.c_int),
                ("detect_ns", ctypes.c_int64), ("revoke_ns", ctypes.c_int64),
                ("agree_ns", ctypes.c_int64), ("rebuild_ns", ctypes.c_int64),
                ("state_transfer_ns", ctypes.c_int64), ("redo_ns", ctypes.c_int64)]


_declare("keel_last_recovery", ctypes.c_uint64, _void_p, ctypes.POINTER(Recovery))

if _lib.keel_abi_version() != ABI_VERSION:
    raise ImportError("keel: %s has binary interface %d, this package needs %d: rebuild with make"
                      % (_library.path(), _lib.keel_abi_version(), ABI_VERSION))


def strerror(status):
    return _lib.keel_strerror(status).decode()


def status_name(status):
    return _lib.keel_status_name(status).decode()


def exit_code(status):
    return _lib.keel_exit_code(status)


class Error(RuntimeError):
    """A keel call failed; .status is the keel_status, .call the function."""

    def __init__(self, call, status):
        self.call = call
        self.status = status
        super().__init__("keel: %s: %s (%s)" % (call, strerror(status), status_name(status)))


def check(call, status):
    if status != OK:
        raise Error(call, status)


class Context:
    """One process's membership in the job (keel_ctx). Not thread-safe, like the C API."""

    def __init__(self):
        handle = _void_p()
        check("keel_init", _lib.keel_init(ctypes.byref(handle)))
        self._handle = handle.value
        self._hooks = []  # the ctypes callbacks must live as long as the context
        self._jit = None

    @property
    def handle(self):
        return self._handle

    def finalize(self):
        if self._handle is None:
            return
        _lib.keel_finalize(self._handle)
        self._handle = None
        if self._jit is not None:
            _lib.keel_ckpt_jit_destroy(self._jit)
            self._jit = None

    def register(self, name, address, size):
        """Registers size bytes at address (memory the caller keeps alive and unmoved)."""
        check("keel_state_register(%s)" % name,
              _lib.keel_state_register(self._handle, name.encode(), address, size))

    def mark_per_process(self, name):
        """Marks a registered buffer as each process's own (keel_registry_mark_per_process):
        moved with the state, left out of the replicas' checksums."""
        check("keel_registry_mark_per_process(%s)" % name,
              _lib.keel_registry_mark_per_process(_lib.keel_state(self._handle), name.encode()))

    def on_failure(self, function):
        """function(cause_status, step_or_None, in_process) runs before every recovery."""
        def trampoline(_argument, failure_p):
            failure = failure_p.contents
            function(failure.cause, failure.step if failure.step_known else None,
                     failure.in_process)
        hook = _FailureHook(trampoline)
        self._hooks.append(hook)
        check("keel_on_failure", _lib.keel_on_failure(self._handle, hook, None))

    def start(self):
        """keel_start: returns its status (a spare blocks here until it takes a rank)."""
        return _lib.keel_start(self._handle)

    def enable_jit(self):
        """Just-in-time checkpoints when the launcher asks (KEEL_CKPT=jit); true when the
        registered state was just restored from one."""
        engine = _void_p()
        check("keel_ckpt_jit_enable", _lib.keel_ckpt_jit_enable(self._handle, None,
                                                                  ctypes.byref(engine)))
        self._jit = engine.value
        return bool(_lib.keel_ckpt_jit_restored(self._jit, None))

    def world(self):
        return _lib.keel_world(self._handle)

    def rank(self):
        world = self.world()
        return _lib.keel_comm_rank(world) if world else -1

    def size(self):
        world = self.world()
        return _lib.keel_comm_size(world) if world else 0

    def is_newcomer(self):
        return bool(_lib.keel_is_newcomer(self._handle))

    def last_recovery(self):
        """keel_last_recovery: the last recovery (a Recovery), its .count how many there were."""
        recovery = Recovery()
        recovery.count = _lib.keel_last_recovery(self._handle, ctypes.byref(recovery))
        return recovery

    def job_id(self):
        return _lib.keel_job_id(self._handle)

    # Step transactions and collectives return their status: the caller decides what
    # KEEL_EREDO and the ending statuses mean for it.
    def step_begin(self, step):
        return _lib.keel_step_begin(self._handle, step)

    def step_commit(self):
        return _lib.keel_step_commit(self._handle)

    def allreduce(self, in_step, send, receive, count, dtype, op):
        if in_step:
            return _lib.keel_step_allreduce(self._handle, send, receive, count, dtype, op)
        return _lib.keel_comm_allreduce(self.world(), send, receive, count, dtype, op)

    def reduce_scatter(self, in_step, send, receive, count_per_rank, dtype, op):
        if in_step:
            return _lib.keel_step_reduce_scatter(self._handle, send, receive, count_per_rank,
                                                 dtype, op)
        return _lib.keel_comm_reduce_scatter(self.world(), send, receive, count_per_rank, dtype,
                                             op)

    def allgather(self, in_step, send, receive, bytes_per_rank):
        if in_step:
            return _lib.keel_step_allgather(self._handle, send, receive, bytes_per_rank)
        return _lib.keel_comm_allgather(self.world(), send, receive, bytes_per_rank)

    def broadcast(self, in_step, buffer, size, root):
        if in_step:
            return _lib.keel_step_broadcast(self._handle, buffer, size, root)
        return _lib.keel_comm_broadcast(self.world(), buffer, size, root)

    def barrier(self):
        return _lib.keel_comm_barrier(self.world())

    def fault_point(self, point):
        return bool(_lib.keel_fault_point(self._handle, point.encode()))

    def report(self, step, loss, samples_per_second):
        _lib.keel_report(self._handle, step, loss, samples_per_second)

    def report_event(self, event, json_fields=None):
        _lib.keel_report_event(self._handle, event.encode(),
                               json_fields.encode() if json_fields is not None else None)
