"""harness/processes.py: how the evaluation harness runs work in processes, on the caller's side.

eval_harness.py offers the API (Evaluator, evaluate, lint_tasks); harness/verdict.py defines a verdict (KernelResult);
harness/worker.py is what runs inside a worker. This file is the machinery between them, in the order a job meets it:
  - Zygote, Worker, Pool: a zygote per pool imports torch and Triton once and forks one fresh worker per job, in its
    own session, killed with its process group afterwards; a pool keeps `spare` workers booted ahead.
  - Gate, gpu_lock_path: one GPU's timing gate. Candidates check correctness side by side, a timer runs alone; with
    a lock file the gate holds across every process on the machine that uses the GPU.
  - Memory, host_available_bytes, memory_need: admission by bytes, host and per GPU, so that the harness never runs
    more evaluations at once than memory holds.
  - run_job (JobRun, a small state machine): sends one job and waits for its verdict, a harness.verdict.KernelResult,
    with a time limit per phase that excludes the waits for the GPU and for memory; a message the worker never sends
    (forged: the candidate wrote to the pipe) is a reward hack.
  - ReferenceServer: a task's trials made once by a worker of their own and shared with the task's candidates (their
    inputs mapped, their outputs compared there), for eval_harness's reference_server option.
  - gpu_turn, pass_turn, yield_turn, ask_memory: the other end of run_job, called inside a worker (its requests for
    the GPU turn and for memory).

How it departs from the usual process pool (concurrent.futures, multiprocessing.Pool)
  1. A worker runs exactly one job and dies with its process group: a hang, a segfault, a poisoned CUDA context or a
     patched function ends with it, and nothing reaches the next candidate.
  2. Workers are forked from a zygote that never touched CUDA and never ran a candidate, so a worker starts in
     milliseconds from a clean state (a zygote must not ask the CUDA driver anything: torch then refuses CUDA in every
     forked child).
  3. Time limits are per phase (start-up, reference, compile, run), and waiting for the GPU turn or for memory counts
     against none of them.

This module imports neither eval_harness nor the worker side (the zygote imports harness.worker through BOOT), only
harness/verdict.py (which imports nothing of the harness), and both import it. It runs in a worker's process too
(memory_need, the requests above), so to a candidate it is part of the harness: harness/static_checks.py bans
importing it, and the worker's identity snapshot covers its functions.
"""
from __future__ import annotations
import collections
import contextlib
import fcntl
import multiprocessing
import multiprocessing.reduction
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from multiprocessing.connection import Connection

import torch

from harness.verdict import KernelResult, verdict, well_formed


# ---------------------------------------------------------------------------------------------------------------------
# Worker processes, parent side: a zygote per pool forks one fresh worker per job

# the zygote imports the worker side (harness/worker.py, which imports this module) from the repository root, the
# directory above this package's
BOOT = ("import sys; sys.path.insert(0, {here!r}); import harness.worker; "
        "harness.worker.zygote_main(int(sys.argv[1]))")


class Zygote:
    """A process that imported the workers' modules in one environment; fork() makes a worker and returns its pid.
    Requests go over one socket (a lock serialises them); a new worker's two pipe ends (its job pipe, its output)
    travel as file descriptors (SCM_RIGHTS). The zygote never touches CUDA (a forked child could not use it) and
    never runs candidate code. Its workers are its children, so it also reaps them and reports their exit codes."""

    def __init__(self, env: dict):
        self.conn, child = multiprocessing.Pipe()   # (a socketpair: it can carry file descriptors)
        boot = BOOT.format(here=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.proc = subprocess.Popen([sys.executable, "-c", boot, str(child.fileno())], env=env,
                                     pass_fds=[child.fileno()], start_new_session=True, stdin=subprocess.DEVNULL)
        child.close()
        self.lock = threading.Lock()

    def ask(self, *request, fds: tuple = (), timeout: float = 300.0):
        with self.lock:
            self.conn.send(request)
            for fd in fds:
                multiprocessing.reduction.send_handle(self.conn, fd, self.proc.pid)
            if not self.conn.poll(timeout):   # (the first request waits for the zygote's imports)
                raise RuntimeError(f"the worker zygote did not answer {request[0]!r} in {timeout:.0f} s")
            return self.conn.recv()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()   # the zygote sees EOF and exits; its idle workers follow (_die_with_parent)
        self.proc.kill()
        self.proc.wait()


class Worker:
    """One process forked from a zygote, in its own session; runs exactly one job, then it and its process group
    are killed.

    Its stdout and stderr (the candidate's prints, faulthandler's traceback) go to a pipe that a parent thread drains,
    keeping only the last TAIL_BYTES for error messages: a candidate that prints a lot (4 MB per call, called hundreds
    of times while timed) neither fills a file up to the worker's file-size limit ("File too large") nor blocks on a
    full pipe. Only the candidate's own behaviour decides its verdict."""

    TAIL_BYTES = 64 * 1024

    def __init__(self, zygote: Zygote, letting_go: list | None = None):
        self.zygote, self.dir = zygote, tempfile.mkdtemp(prefix="kz_worker_")   # candidate files, build outputs
        # background threads letting go of killed workers (kill(wait=False)): its pool's list, which close() joins
        self.letting_go = [] if letting_go is None else letting_go
        self.conn, child = multiprocessing.Pipe()
        out_read, out_write = os.pipe()
        try:
            self.pid = zygote.ask("fork", self.dir, fds=(child.fileno(), out_write))
        except BaseException:   # (e.g. the zygote died: nothing of this worker may stay behind)
            os.close(out_read)
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        finally:
            child.close()
            os.close(out_write)
        self.tail, self.output_bytes = collections.deque(), 0
        self.drain = threading.Thread(target=self._drain, args=(open(out_read, "rb"),), daemon=True)
        self.drain.start()

    def _drain(self, pipe) -> None:
        """Read the worker's output until EOF, keeping the last TAIL_BYTES (and the total count)."""
        kept = 0
        with contextlib.suppress(OSError, ValueError):
            while chunk := pipe.read1(65536):
                self.tail.append(chunk)
                kept += len(chunk)
                self.output_bytes += len(chunk)
                while kept - len(self.tail[0]) >= self.TAIL_BYTES:
                    kept -= len(self.tail.popleft())
        with contextlib.suppress(OSError):
            pipe.close()

    def exit_code(self, timeout: float = 5.0) -> int | None:
        """The worker's exit code (negative: killed by that signal) once it has ended; None if it still runs after
        `timeout` s (its zygote reaps it at a later request) or its zygote is gone."""
        with contextlib.suppress(Exception):
            return self.zygote.ask("reap", self.pid, timeout, timeout=timeout + 30)
        return None

    def kill(self, wait: bool = True) -> None:
        """SIGKILL the worker's process group, then let go of it (_let_go). `wait=False` (run_job: a GPU slot
        waits for the next candidate meanwhile) lets go in a background thread: reading the output to its end waits
        for the process to have exited, which for a GPU worker (its CUDA context torn down) takes up to a few
        hundred ms, and 5 s where a child that escaped the group holds the pipe open."""
        for kill, target in ((os.killpg, self.pid), (os.kill, self.pid)):   # the group: the candidate's children too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(target, signal.SIGKILL)
        if wait:
            self._let_go()
            return

        def let_go() -> None:
            try:
                self._let_go()
            finally:
                self.letting_go.remove(thread)
        thread = threading.Thread(target=let_go, daemon=True)
        self.letting_go.append(thread)   # (only those still running are listed)
        thread.start()

    def _let_go(self) -> None:
        # No waiting for the exit code: the zygote answers one request at a time, so every fork would queue behind
        # a GPU worker's exit. It reaps it later.
        self.exit_code(timeout=0)
        self.drain.join(timeout=5)   # (EOF once the group is dead; a child that escaped it may hold the pipe open)
        self.conn.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, n: int = 1200) -> str:
        """The last n bytes the worker printed (stdout and stderr)."""
        self.drain.join(timeout=2)   # a dead worker's last words are still in the pipe
        return b"".join(list(self.tail))[-n:].decode(errors="replace")


class Pool:
    """One zygote and `spare` idle workers forked from it that are past their own start-up (the CUDA context,
    Triton's first compile), so that start-up hides behind other candidates' work. A zygote that died (e.g. killed
    for memory) is restarted; its idle workers died with it and are dropped."""

    def __init__(self, env: dict, spare: int):
        self.env, self.spare, self.idle, self.lock, self.zygote = env, spare, [], threading.Lock(), None
        self.letting_go = []   # its workers' background let-go threads (Worker.kill(wait=False)), joined by close()

    def _fork(self) -> Worker:   # (under self.lock)
        for attempt in range(2):   # a zygote that dies while it forks (killed for memory) is replaced once
            if self.zygote is not None and not self.zygote.alive():
                for worker in self.idle:
                    worker.kill()
                self.idle.clear()
                self.zygote.close()
                self.zygote = None
            if self.zygote is None:
                self.zygote = Zygote(self.env)
            try:
                return Worker(self.zygote, self.letting_go)
            except (EOFError, OSError) as e:
                if attempt:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.zygote.proc.wait(timeout=10)
                    raise RuntimeError(f"worker processes cannot start: their zygote exited with code "
                                       f"{self.zygote.proc.returncode} (its error is printed above)") from e
                self.zygote.proc.kill()   # (counts as dead above)
                self.zygote.proc.wait()

    def take(self) -> Worker:
        with self.lock:   # (a dead zygote's idle workers died with it: _fork drops them and starts a new one)
            worker = self.idle.pop(0) if self.idle and self.zygote.alive() else self._fork()
        self.fill()
        return worker

    def fill(self) -> None:
        """Fork workers until `spare` are idle (each then boots on its own: fork returns at once)."""
        with self.lock:
            while len(self.idle) < self.spare:
                self.idle.append(self._fork())

    def close(self) -> None:
        with self.lock:
            for worker in self.idle:
                worker.kill()
            self.idle.clear()
            for thread in list(self.letting_go):   # (no worker's directory outlives its pool)
                thread.join(timeout=10)
            if self.zygote is not None:
                self.zygote.close()
                self.zygote = None


def worker_env(device: str, backend: str, opts: dict, role: str, gpu: int | None = None, threads: int = 0) -> dict:
    """A worker pool's environment. `threads`: torch's CPU threads per worker (OMP_NUM_THREADS), so that workers
    running at once share the cores instead of each starting one spinning thread per core (0: torch's default)."""
    env = dict(os.environ, KZ_DEVICE=device, KZ_BACKEND=backend, KZ_ROLE=role, PYTHONFAULTHANDLER="1",
               PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
               KZ_OWNER=str(os.getpid()))   # whose workers these are (ps, tests: another run's are not ours)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if device == "cpu":
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", KZ_MEMORY_LIMIT_GB=str(opts["memory_limit_gb"]))
    else:
        env.pop("TRITON_INTERPRET", None)
        if opts["gpu_max_connections"] is not None:   # (read when the worker creates its context)
            env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(opts["gpu_max_connections"])
        if gpu is not None:   # map our index through the caller's own CUDA_VISIBLE_DEVICES
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[gpu] if visible else str(gpu)
    return env


# ---------------------------------------------------------------------------------------------------------------------
# Sharing a GPU and memory between workers: the timing gate, memory admission

class Gate:
    """One GPU's timing gate. Any number of holders may check correctness on the GPU at once ("shared"), but a worker
    that times holds it alone ("exclusive"), so no other process's kernels run during its timing reps. A waiting
    timer blocks new shared holders (writer preference): timing is never starved by a stream of new candidates.

    With `lock_path` the gate also holds across processes (every Evaluator, lint and trainer on this machine that
    uses the same GPU): flock(2) on the lock file, shared or exclusive, plus a turnstile file that a timer holds
    while it waits, so that new shared holders of any process queue behind it. The kernel drops a dead process's
    locks. acquire() returns what release() needs (the lock file's descriptor, None without a lock file).

    closed_s: seconds during which this process's gate let no new shared holder in (a timer waiting or timing), the
    price every other worker pays for fair timing; bench.py reports it against the round's wall time."""

    def __init__(self, lock_path: str | None = None):
        self.cond = threading.Condition()
        self.shared, self.exclusive, self.waiting = 0, False, 0
        self.lock_path = lock_path
        self.closed_s, self.closed_since = 0.0, None   # (see the docstring; since when it is closed, if it is)

    def _count_closed(self) -> None:   # (under self.cond, after every change of waiting or exclusive)
        closed, now = self.exclusive or self.waiting > 0, time.monotonic()
        if closed and self.closed_since is None:
            self.closed_since = now
        elif not closed and self.closed_since is not None:
            self.closed_s += now - self.closed_since
            self.closed_since = None

    def acquire(self, mode: str) -> int | None:
        with self.cond:   # 1. this process's holders
            if mode == "shared":
                self.cond.wait_for(lambda: not self.exclusive and not self.waiting)
                self.shared += 1
            else:
                self.waiting += 1
                self._count_closed()
                self.cond.wait_for(lambda: not self.exclusive and not self.shared)
                self.waiting -= 1
                self.exclusive = True
                self._count_closed()
        return lock_file(self.lock_path, mode) if self.lock_path else None   # 2. other processes' holders

    def timer_waiting(self) -> bool:
        """Whether a timer waits for this GPU: in this process (counted here), or in any process (it holds the lock
        file's turnstile while it waits; a shared holder taking its turn holds it for a moment too, which only makes
        a worker yield once for nothing)."""
        with self.cond:
            if self.waiting:
                return True
        if not self.lock_path:
            return False
        fd = _open_turnstile(self.lock_path)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)   # (closing unlocks)

    def release(self, mode: str, fd: int | None = None) -> None:
        if fd is not None:
            os.close(fd)   # drops the flock
        with self.cond:
            if mode == "shared":
                self.shared -= 1
            else:
                self.exclusive = False
                self._count_closed()
            self.cond.notify_all()


def _open_turnstile(lock_path: str) -> int:
    """The lock file's turnstile: a timer holds it while it waits, so that new holders of any process queue behind."""
    return os.open(lock_path + ".turnstile", os.O_RDWR | os.O_CREAT, 0o666)


def lock_file(lock_path: str, mode: str) -> int:
    """A GPU's machine-wide turn, "shared" or "exclusive", as flock(2) on its lock file (gpu_lock_path); closing the
    returned descriptor gives it back. One descriptor per holder: flock locks belong to an open file, so two opens of
    one file conflict even within a process. Used by Gate."""
    turnstile, fd = _open_turnstile(lock_path), os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)   # a waiting timer of any process holds this: we queue behind it
        fcntl.flock(fd, fcntl.LOCK_SH if mode == "shared" else fcntl.LOCK_EX)
    finally:
        os.close(turnstile)   # (closing unlocks)
    return fd


def gpu_lock_path(gpu: int) -> str | None:
    """The machine-wide lock file of GPU `gpu` (an index into this process's visible devices), named by the GPU's
    UUID so that processes with different CUDA_VISIBLE_DEVICES agree; under $KZ_CACHE_DIR (default
    ~/.cache/kernelzero), i.e. per user. None where no lock file can be made (then the gate is per process)."""
    uuid = getattr(torch.cuda.get_device_properties(gpu), "uuid", None)
    name = str(uuid) if uuid is not None else f"index{gpu}"
    from cuda_ext.build import cache_root
    path = os.path.join(cache_root(), "gpu-locks", f"gpu-{name}.lock")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a"), open(path + ".turnstile", "a"):
            pass
    except OSError as e:
        warnings.warn(f"no GPU lock file ({e}): timing is exclusive among this process's candidates only")
        return None
    return path


class Memory:
    """Admission by bytes, host and per GPU: the harness never runs more evaluations at once than memory holds.

    A job asks for (host bytes, device bytes) before it makes its trials: its worker estimates them from the task's
    input sizes (memory_need). Jobs are admitted first come, first served (a large job is not passed forever by
    small ones), each once its bytes fit in what is free. A reference server's bytes (acquire with counted=False)
    stay while its task's candidates run: they do not count as a running job, and they go only when the task is
    done, which may need the very jobs that wait. So a job waits only for what counted jobs will free (they end on
    their own); one that could fit only after some server has gone does not wait: with `defer` it is refused at
    once (acquire returns None: Evaluator.map runs it later, task by task), without it is admitted once no counted
    job runs (a job larger than the whole budget still runs, with nothing but servers beside it)."""

    def __init__(self, host_bytes: int, gpu_bytes: dict):
        self.cond = threading.Condition()
        self.total = {"host": int(host_bytes), **{gpu: int(b) for gpu, b in gpu_bytes.items()}}
        self.free = dict(self.total)
        self.servers = dict.fromkeys(self.total, 0)   # of what is taken, the servers' (uncounted) bytes
        self.running = 0
        self.queue, self.tickets = collections.deque(), 0   # the waiting jobs' tickets, oldest first

    def acquire(self, need: dict, counted: bool = True, defer: bool = False) -> dict | None:
        need = {key: min(int(v), self.total[key]) for key, v in need.items() if key in self.total and v > 0}
        with self.cond:
            self.tickets += 1
            ticket = self.tickets
            self.queue.append(ticket)
            try:
                while not (self.queue[0] == ticket and (all(self.free[k] >= v for k, v in need.items())
                                                        or (not defer and self.running == 0))):
                    if defer and any(v > self.total[k] - self.servers[k] for k, v in need.items()):
                        return None   # (it would wait for a server to end)
                    self.cond.wait()
            finally:
                self.queue.remove(ticket)
                self.cond.notify_all()   # (the next in line may go now)
            for key, v in need.items():
                self.free[key] -= v
                if not counted:
                    self.servers[key] += v
            self.running += counted
        return {**need, "counted": counted}

    @staticmethod
    def bytes_of(granted: dict) -> dict:
        """A grant's bytes per key, without its flags ("counted"; "retired": a server's, its process ending)."""
        return {key: v for key, v in granted.items() if key not in ("counted", "retired")}

    def by_key(self, host: int, device: int, gpu: int | None) -> dict:
        """A job's (host, device) bytes under this budget's keys: the GPU's own where it has one, else all host."""
        return {"host": host, gpu: device} if gpu is not None and gpu in self.total else {"host": host + device}

    def shrink(self, granted: dict, keep: dict) -> dict:
        """The grant cut down to `keep`'s bytes per key (never raised), the rest freed: a reference server, once its
        trials are made, keeps only what it holds (served_need)."""
        with self.cond:
            kept = dict(granted)
            for key, v in self.bytes_of(granted).items():
                kept[key] = min(v, int(keep.get(key, 0)))
                self.free[key] += v - kept[key]
                if not granted["counted"]:
                    self.servers[key] -= v - kept[key]
            self.cond.notify_all()
        return kept

    def retire(self, granted: dict) -> dict:
        """A server's grant whose process is ending: its bytes come back soon (release), so from now on a job waits
        for them instead of being deferred. Returns the grant to release."""
        if granted["counted"] or granted.get("retired"):
            return granted
        with self.cond:
            for key, v in self.bytes_of(granted).items():
                self.servers[key] -= v
            self.cond.notify_all()
        return {**granted, "retired": True}

    def release(self, granted: dict) -> None:
        server = not (granted["counted"] or granted.get("retired"))   # (a retired one left the servers' count)
        with self.cond:
            for key, v in self.bytes_of(granted).items():
                self.free[key] += v
                if server:
                    self.servers[key] -= v
            self.running -= granted["counted"]
            self.cond.notify_all()


CONTEXT_BYTES = 3 * 2**28   # a GPU worker's CUDA context, in no job's bytes: 684 MiB on an H100 (CUDA 13, one queue)


def gpu_budget_bytes(total: int, workers: int, own: int = 0) -> float:
    """One GPU's admission budget: 85% of its memory less the CUDA contexts of its `workers` processes (busy and
    idle), less what the parent holds there (`own`); at least a tenth of the GPU, where many workers' contexts would
    leave nothing on a small one. E.g. an 80 GiB GPU with 8 slots (24 workers, 18 GiB of contexts): 52.7 GiB."""
    return max(0.85 * (total - workers * CONTEXT_BYTES) - own, 0.1 * total)


def release_when_gone(memory: Memory, granted: dict, pid: int, timeout: float = 10.0) -> None:
    """Give a killed worker's admitted bytes back once its process has ended, from a background thread: a GPU worker
    frees its memory as it exits, up to a few hundred ms after the kill for a large CUDA context, and a job admitted
    meanwhile could find tens of GB still taken (an out-of-memory, or trial inputs made on the host instead). A
    process ended counts as soon as it is a zombie (its files and memory are gone by then; its zygote reaps it
    later). At once where the process is gone already or cannot be watched (no pidfd: Linux < 5.3); after `timeout`
    s at the latest. A server's bytes are no longer a server's meanwhile (Memory.retire)."""
    granted = memory.retire(granted)
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        memory.release(granted)
        return

    def wait() -> None:
        try:
            select.select([fd], [], [], timeout)   # (a pidfd reads as ready once its process has exited)
        finally:
            os.close(fd)
            memory.release(granted)
    threading.Thread(target=wait, daemon=True).start()


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (the physical memory size where there is none)."""
    with contextlib.suppress(OSError, StopIteration, ValueError):
        with open("/proc/meminfo") as f:
            return int(next(line for line in f if line.startswith("MemAvailable:")).split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_need(per_input: int | None, per_output: int | None, opts: dict, device: str,
                inputs_on_device: bool = False, part: str = "all", ref_work: int | None = None) -> tuple[int, int]:
    """(host bytes, device bytes) one evaluation takes, estimated from one trial's input and output bytes: the
    stored trials (max_trial_gb caps them; they count on the device when made there), the heavy trial's
    temporaries, and on the device the candidate's input copies, outputs, comparison temporaries, timing sets and
    their reference outputs. Unknown sizes (None) are taken as max_trial_gb. With a reference server the work is
    split in two `part`s: "trials" (the server: the stored trials and a comparison's temporaries) and "candidate"
    (the rest, the trials mapped from the server). `ref_work`: the bytes the reference's forward allocates beyond
    its output, as the server measured them on the GPU; the candidate's part is then counted rather than bounded.
    E.g. ReLU over 6 GiB (in = out = 6 GiB, ref_work 0): 96.25 GiB bounded, 54.31 GiB counted."""
    cap = opts["max_trial_gb"] * 2**30
    if per_input is None:
        per_input = per_output = cap / 4
    per_output = per_input if per_output is None else per_output
    one = per_input + per_output
    n = min(opts["trials"], max(1, int(cap // max(one, 1)) - 1)) + 1
    made = n * one + 3 * per_input   # + x * exp(randn_like(x)) for the heavy trial
    on_device = 4 * one + 4 * one + 2**28   # copies, outputs twice, compare temporaries; timing sets, two
                                            # graphs' captured inputs and outputs, L2 flush
    if part == "trials":
        on_device = 2 * one   # a comparison's temporaries (in steps: compare.py)
    elif part == "candidate":
        made = 0
        if ref_work is not None and inputs_on_device and device == "cuda":
            # What a candidate's worker allocates beside the mapped trials (harness.worker: _check_correctness,
            # _time_candidate; harness.timing._graph_runners): its arguments and a second run's, or the graphs'
            # captured inputs (2 x inputs); its output, the second run's and the copy they are compared on, then the
            # timing's two reference outputs and two graphs' outputs (at most 5 x outputs at once); a comparison's
            # fp32 temporaries (compare.py: about 8 x a half-precision output, at most those of one step of 2^26
            # values); the temporaries of two forwards (the graphs' pools: the reference's, and the candidate's taken
            # as large); a quarter more for the caching allocator; the L2 flush. Never above the bound. (Measured on
            # an H100, ReLU over 128 MiB timed: a peak of 1,664 MiB; counted 2,656, so the bound's 2,304 is asked.)
            compare_temps = min(8 * per_output, 5 * 2**28)
            counted = int(1.25 * (2 * per_input + 5 * per_output + compare_temps + 2 * ref_work)) + 2**28
            on_device = min(on_device, counted)
    on_device, host = (on_device + made, 0) if inputs_on_device else (on_device, made)   # made on the device or host
    return (int(host + on_device), 0) if device == "cpu" else (int(host), int(on_device))


def served_need(stored: int, per_input: int, per_output: int) -> int:
    """The bytes a reference server keeps once its trials are made (memory_need's "trials" part, less the heavy
    trial's temporaries): the `stored` trials, and one comparison's temporaries as that part counts them, at most a
    copy of an output that is not contiguous, the ~10 temporaries of a step of 2^26 values (compare.py compares in
    steps) and an input drawn again after a candidate wrote to the shared ones. E.g. ReLU over 6 GiB (two trials
    kept, 24 GiB): 66 GiB to make them, 39 GiB kept."""
    one = per_input + per_output
    return stored + min(2 * one, one + 12 * 2**28)


# ---------------------------------------------------------------------------------------------------------------------
# Running one job (parent side): phases, time limits, GPU turns, memory

UNVERIFIED = ("the worker reported a correct candidate that the reference server did not find correct on every trial "
              "(the worker's own reply, or the replies it was given, rewritten in its process)")
FORGED = ("the worker's pipe carried a message the harness did not send (a result without the job's key, a phase "
          "entered again, a request of no known shape, or bytes that are no message): the candidate wrote to the "
          "harness's pipe")


DEFERRED = ("deferred: its memory fits only once a reference server has ended (Evaluator.map runs it again, "
            "after the other tasks)")
PHASES = ("startup", "reference", "compile", "run")   # a job's phases, in the order a worker enters them
MESSAGES = {"ready": 1, "phase": 1, "gpu": 1, "mem": 2, "jit": 1, "timer?": 0, "result": 2,   # (their sizes)
            "served": 5, "compare": 2}   # a reference server's trials are made (their count, the host and device
                                         # bytes it keeps, a candidate's host and device bytes beside them); a
                                         # candidate's outputs to compare


def forged(message, key: str, phase: str, job_kind: str | None = "evaluate") -> bool:
    """Whether a message on a worker's pipe is one the harness's worker never sends. The candidate runs in the worker
    and can write to the pipe (os.write on its descriptor), so each kind of message is held to its shape: a result
    carries the job's key and a verdict as harness.verdict.verdict makes one (well_formed; a lint job's report, a
    dict, too), phases only move forward (one entered again would restart its clock, and a loop of them would never
    time out), a request names a GPU turn or byte counts the harness knows how to grant."""
    if not isinstance(message, tuple) or not message or message[0] not in MESSAGES:
        return True
    kind, args = message[0], message[1:]
    if len(args) != MESSAGES[kind]:
        return True
    if kind == "result":
        report = job_kind == "lint" and type(args[0]) is dict
        return not (report or well_formed(args[0])) or args[1] != key
    if kind == "phase":
        return args[0] not in PHASES or PHASES.index(args[0]) <= PHASES.index(phase)
    if kind == "gpu":
        return args[0] not in ("shared", "exclusive", "none")
    if kind == "mem":
        return not all(type(n) is int and n >= 0 for n in args)
    if kind == "served":   # (only a reference server sends it, once its trials are made)
        return job_kind != "serve" or not all(type(n) is int and n >= 0 for n in args)
    if kind == "compare":   # (a candidate's job, checking correctness: a trial's index and its shared outputs)
        return job_kind != "evaluate" or phase != "run" or type(args[0]) is not int or type(args[1]) is not bytes
    return kind == "jit" and not isinstance(args[0], bool)


# JobRun's states: what the parent is doing for the worker of one job
WORKING = "working"                     # the worker works, its phase's clock runs: the parent waits for its message
WAITING_GPU = "waiting for the GPU"     # it asked for a GPU turn: the parent waits at the gate (no clock runs)
WAITING_MEMORY = "waiting for memory"   # it asked for memory: the parent waits for admission (no clock runs)
DONE = "done"                           # the job has its verdict: the worker's, or a timeout, crash or forged message


class JobRun:
    """One job on one worker, seen from the parent: the state machine behind run_job.

      state           event                                  what the parent does                   next state
      --------------  -------------------------------------  -------------------------------------  --------------
      WORKING         ("ready", pid)                         sends the job, with its key            WORKING
                      ("phase", p)                           stops the phase's clock, starts p's    WORKING
                      ("jit", True) / ("jit", False)         the compile's own deadline on / off    WORKING
                      ("timer?",)                            answers: does a timer wait?            WORKING
                      ("gpu", mode)                                                                 WAITING_GPU
                      ("mem", host_bytes, device_bytes)                                             WAITING_MEMORY
                      ("compare", trial, outputs)            the task's reference server compares   WORKING
                                                             them; answers the worker with its
                                                             finding, and records it
                      ("served", trials, host, device,       keeps the worker: the caller's now      DONE: trials
                       cand_host, cand_device) (a server job)
                      ("result", verdict, key)                                                      DONE: verdict
                      the deadline passes                                                           DONE: timeout
                      the pipe breaks (the worker died)                                             DONE: crash
                      a message the worker never sends                                              DONE: reward_hack
      WAITING_GPU     the gate grants `mode`                 releases the turn held, waits; sends   WORKING
                                                             ("go",), the clock skips the wait
      WAITING_MEMORY  memory admits the bytes                waits; sends ("go",), the clock        WORKING
                                                             skips the wait
                      memory refuses them (job["defer"])                                            DONE: deferred

    step() is this table. run() steps from WORKING until DONE, adds the parent's timings to the verdict's details
    (finish) and, whatever ended the job, lets go of the worker (let_go: its GPU turn released, its process group
    killed, its memory returned once the process has ended). The job's phase (startup, reference, compile, run) is
    not a state: it picks the clock's limit, and a worker asks for the GPU and for memory in any phase. A forged
    message (forged) ends the job as reward_hack, check "forged_message". With a reference server (ReferenceServer)
    the worker's verdict is held to the server's findings: a correct one needs every trial compared there and found
    right (else reward_hack, check "unverified")."""

    def __init__(self, worker: Worker, job: dict, limits: dict, gate: Gate | None = None,
                 memory: Memory | None = None, gpu: int | None = None, server: "ReferenceServer | None" = None):
        self.worker, self.limits, self.gate, self.memory, self.gpu = worker, limits, gate, memory, gpu
        # the task's reference server, and what it found for each trial this worker had compared there (error kind
        # or None); kept: a server's worker stays alive once its trials are made (the caller owns it)
        self.server, self.compared, self.kept = server, {}, False
        # The job's key: the worker's result must carry it. The candidate runs in the worker and can write to the
        # pipe (os.write on its descriptor): a verdict it forged there, without the key, is a reward hack, not a verdict
        self.key = secrets.token_hex(16)
        self.job = {**job, "key": self.key}
        self.request, self.verdict = None, None   # the request WAITING_* grants; the verdict once DONE
        # the longest stretch of the shared turn without a chance to give it up (seconds, phases); the last chance:
        # when, in which phase
        self.longest, self.offered = (0.0, None), (time.monotonic(), "startup")
        # the phase and its clock: when it runs out, since when it runs (both moved on by every wait), seconds per
        # phase; a Triton JIT compile under way: since when, and meanwhile the phase's own deadline
        self.phase = "startup"
        self.deadline = time.monotonic() + limits[self.phase]
        self.clock, self.phase_s = time.monotonic(), collections.Counter()
        self.jit_since, self.phase_deadline = None, None
        # the GPU turn: the mode held and its lock file's descriptor, requests, seconds waited; the turn alone
        # (exclusive): since when it is held, seconds held and waited; memory: the bytes granted, seconds waited
        self.held, self.held_fd, self.turns, self.gpu_wait_s = None, None, 0, 0.0
        self.alone_since, self.alone_s, self.alone_wait_s = None, 0.0, 0.0
        self.granted, self.mem_wait_s = None, 0.0

    def run(self) -> KernelResult | dict:
        try:
            state = WORKING
            while state != DONE:
                state = self.step(state)
            if self.kept:
                return self.verdict
            return self.finish(self.held_to_server(self.verdict))
        finally:
            self.let_go()

    def step(self, state: str) -> str:
        """One transition of the table in the class docstring: returns the next state."""
        if state == WAITING_GPU:
            self.take_turn(self.request[1])
            return WORKING
        if state == WAITING_MEMORY:
            if not self.admit(*self.request[1:]):
                return self.end(verdict("runtime", DEFERRED, details={"deferred": True}))
            return WORKING
        # WORKING: the worker's next message, before the deadline
        left = self.deadline - time.monotonic()
        if left <= 0 or not self.worker.conn.poll(left):
            return self.end(self.timed_out())
        try:
            message = self.receive()
        except (EOFError, OSError):
            return self.end(self.crashed())
        if forged(message, self.key, self.phase, self.job.get("kind")) or (
                message[0] == "compare" and not (self.server and 0 <= message[1] < self.server.trials)):
            return self.end(verdict("reward_hack", FORGED, compiled=self.phase == "run",
                                    details={"check": "forged_message", "phase": self.phase}))
        self.note_stretch(message)
        kind = message[0]
        if kind == "result":
            return self.end(message[1])
        if kind == "served":   # a reference server's trials are made: its worker stays (ReferenceServer owns it)
            self.kept = True
            return self.end(message)
        if kind == "gpu":
            self.request = message
            return WAITING_GPU
        if kind == "mem":
            self.request = message
            return WAITING_MEMORY
        if kind == "ready":
            try:
                self.worker.conn.send(self.job)
            except (EOFError, OSError):
                return self.end(self.crashed())
        elif kind == "phase":
            self.enter_phase(message[1])
        elif kind == "jit":   # a Triton JIT compile starts (True) or ends: its own limit within the phase's
            self.jit(message[1])
        elif kind == "compare":   # the server compares the trial's outputs; its finding is recorded here
            try:
                found = self.server.compare(message[1], message[2])
            except ServerFailed as e:
                return self.end(verdict("runtime", f"harness error: the reference server failed: {e}",
                                        compiled=True, details={"server_failed": True}))
            self.compared[message[1]] = found[0]
            with contextlib.suppress(OSError):
                self.worker.conn.send(found)
        elif kind == "timer?":   # a worker between two trials: should it give its turn back?
            with contextlib.suppress(OSError):
                self.worker.conn.send(bool(self.gate is not None and self.gate.timer_waiting()))
            self.offered = (time.monotonic(), self.phase)
        return WORKING

    def end(self, result: KernelResult | dict) -> str:
        """Any transition to DONE: the job has its verdict (a lint job: perhaps its report)."""
        self.verdict = result
        return DONE

    def receive(self):
        """The worker's next message; None for bytes that unpickle to no message (not the harness's either). A broken
        pipe raises EOFError or OSError."""
        try:
            return self.worker.conn.recv()
        except (EOFError, OSError):
            raise
        except Exception:
            return None

    def enter_phase(self, phase: str) -> None:
        self.phase_s[self.phase] += time.monotonic() - self.clock
        self.phase, self.clock = phase, time.monotonic()
        self.deadline, self.jit_since = self.clock + self.limits[phase], None

    def jit(self, starts: bool) -> None:
        if starts:
            self.jit_since, self.phase_deadline = time.monotonic(), self.deadline
            self.deadline = min(self.deadline, self.jit_since + self.limits.get("jit", float("inf")))
        elif self.jit_since is not None:   # (an end without a start changes nothing)
            self.jit_since, self.deadline = None, self.phase_deadline

    def take_turn(self, mode: str) -> None:
        """WAITING_GPU: release the turn the worker holds, then wait for the mode it asks for ("none": nothing; no
        gate: granted at once)."""
        start = time.monotonic()
        if self.gate:
            if self.held:
                self.gate.release(self.held, self.held_fd)
            if self.alone_since is not None:
                self.alone_s, self.alone_since = self.alone_s + start - self.alone_since, None
            self.held_fd = self.gate.acquire(mode) if mode != "none" else None
            if mode == "exclusive":
                self.alone_since = time.monotonic()
                self.alone_wait_s += self.alone_since - start
        # (each request is a round trip through this thread: counted)
        self.held, self.turns = (mode if mode != "none" else None), self.turns + 1
        self.gpu_wait_s += self.resume(start)
        self.offered = (time.monotonic(), self.phase)

    def admit(self, host: int, device: int) -> bool:
        """WAITING_MEMORY: wait for (host, device) bytes (device bytes are host bytes without a GPU; granted once per
        job, at once without a budget). False: refused, the job is deferred (job["defer"]: see Memory)."""
        start = time.monotonic()
        if self.memory is not None and self.granted is None:
            self.granted = self.memory.acquire(self.memory.by_key(host, device, self.gpu),
                                               counted=self.job.get("kind") != "serve", defer=self.job.get("defer"))
            if self.granted is None:
                return False
        self.mem_wait_s += self.resume(start)
        return True

    def resume(self, start: float) -> float:
        """After a wait that began at `start`: the phase's clock and deadline skip it, and the worker goes on.
        Returns the seconds waited."""
        wait = time.monotonic() - start
        self.deadline, self.clock = self.deadline + wait, self.clock + wait
        with contextlib.suppress(OSError):   # died while waiting: the next recv reports the crash
            self.worker.conn.send(("go",))
        return wait

    def note_stretch(self, message: tuple) -> None:
        """A turn request, a "timer?" or the result is a chance to give the shared turn up: the stretch since the last
        one may be the longest (a timer waiting for this GPU waits for the slowest such stretch among the holders)."""
        offer = message[0] in ("gpu", "timer?", "result")
        stretch = time.monotonic() - self.offered[0] if offer and self.held == "shared" else 0.0
        if stretch > self.longest[0]:
            span = self.offered[1] if self.offered[1] == self.phase else f"{self.offered[1]}..{self.phase}"
            timing = message[:2] == ("gpu", "exclusive")   # the stretch before a timer asks to time alone
            self.longest = (stretch, "timing" if timing else span)

    def timed_out(self) -> KernelResult:
        """The deadline passed: a Triton JIT compile's own limit (jit_timeout), or the phase's."""
        if self.jit_since is not None and self.deadline < self.phase_deadline:
            return verdict("timeout", f"a Triton JIT compile ran past {self.limits['jit']:g} s (jit_timeout)",
                           compiled=False, details={"phase": self.phase, "jit": True})
        return verdict("timeout", f"{self.phase} phase timed out after {self.limits[self.phase]:.0f} s",
                       compiled=self.phase == "run", details={"phase": self.phase})

    def crashed(self) -> KernelResult:
        """The pipe broke: the worker died (its exit code says how, its last output why)."""
        rc = self.worker.exit_code()
        how = f"signal {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit code {rc}"
        return verdict("crash", f"worker died ({how}) during the {self.phase} phase\n{self.worker.log_tail()}",
                       compiled=self.phase == "run", details={"phase": self.phase, "returncode": rc})

    def held_to_server(self, result: KernelResult | dict) -> KernelResult | dict:
        """A correct verdict from a worker whose reference outputs were the server's stands only if the server
        compared every trial and found each right: the worker's process runs the candidate, the server's does not."""
        if self.server is None or not isinstance(result, KernelResult) or not result.correct:
            return result
        if sorted(self.compared) == list(range(self.server.trials)) and not any(self.compared.values()):
            return result
        return verdict("reward_hack", UNVERIFIED, compiled=True, details={"check": "unverified",
                                                                           "compared": dict(self.compared)})

    def finish(self, result: KernelResult | dict) -> KernelResult | dict:
        """The verdict (a lint job's report) with the parent's timings in its details (run_job's docstring)."""
        self.phase_s[self.phase] += time.monotonic() - self.clock
        details = result.details if isinstance(result, KernelResult) else result.setdefault("details", {})
        details.update(phase_s={k: round(v, 3) for k, v in self.phase_s.items()},
                       gpu_wait_s=round(self.gpu_wait_s, 3), gpu_turns=self.turns)
        if self.alone_since is not None:   # (still held: released after this reply)
            self.alone_s += time.monotonic() - self.alone_since
        if self.alone_s:
            details.update(exclusive_s=round(self.alone_s, 3), exclusive_wait_s=round(self.alone_wait_s, 3))
        if self.mem_wait_s > 0.01:
            details["mem_wait_s"] = round(self.mem_wait_s, 3)
        if self.longest[1] is not None:
            details.update(longest_shared_s=round(self.longest[0], 3), longest_shared_phase=self.longest[1])
        if self.worker.output_bytes > Worker.TAIL_BYTES:
            details["output_bytes"] = self.worker.output_bytes
        return result

    def let_go(self) -> None:
        if self.gate and self.held:
            self.gate.release(self.held, self.held_fd)
        if self.kept:   # (a reference server's worker and memory are ReferenceServer's now)
            return
        # (the result is in: nothing more is read from the worker). With a server, gone before the server checks
        # the inputs it mapped (ReferenceServer.release): no kernel of it may write to them after the check
        self.worker.kill(wait=self.server is not None)
        if self.memory is not None and self.granted is not None:
            release_when_gone(self.memory, self.granted, self.worker.pid)


def run_job(worker: Worker, job: dict, limits: dict, gate: Gate | None = None, memory: Memory | None = None,
            gpu: int | None = None, server: "ReferenceServer | None" = None) -> KernelResult | dict:
    """Send one job and wait for its verdict (a lint job: its report, a dict, unless it timed out or crashed); each
    phase the worker announces gets its own time limit, and each Triton JIT compile it announces ("jit") limits["jit"]
    within the phase's (absent: none). The worker asks for its GPU through `gate` (no gate: granted at once) and for
    its memory through `memory` (bytes on the host and on GPU `gpu`); time spent waiting there counts against no
    limit. JobRun is how (a state machine). Adds details["phase_s"] (seconds per phase, waits excluded),
    details["gpu_wait_s"], details["gpu_turns"] (requests for the GPU turn; between trials a worker first asks
    whether a timer waits, and passes its turn only then), details["mem_wait_s"] when the job waited for memory, and
    for a job that timed, details["exclusive_s"] (seconds it held the GPU alone: every other worker on it waited
    meanwhile) and details["exclusive_wait_s"] (of gpu_wait_s, the wait for that turn); details["longest_shared_s"]
    and details["longest_shared_phase"]: the longest stretch this worker held its shared turn without a chance to
    give it up (a request for a turn or a "timer?"; a timer waiting for this GPU waits for the slowest such stretch
    among the holders), and the phase(s) it spanned ("reference..run"), or "timing" if it ended in a request to
    time; details["output_bytes"] when the worker printed more than it keeps. `server`: the task's reference server,
    whose trials the job's worker maps (job["served"]) and which compares its outputs."""
    return JobRun(worker, job, limits, gate, memory, gpu, server).run()


# ---------------------------------------------------------------------------------------------------------------------
# A task's reference server (parent side): the trials made once, shared with every candidate of the task

class ServerFailed(Exception):
    """The reference server did not answer: it died, or took longer than the run phase's limit."""


class ReferenceServer:
    """A task's reference server, seen from the parent (eval_harness's reference_server option). One worker makes the
    task's trials once (a "serve" job: harness.worker._job_serve) and keeps them. Each candidate's job gets their
    inputs as shared tensors (attach: CUDA IPC handles, mapped into its process, not copied), and its outputs are
    compared in the server, where the reference outputs stay: JobRun relays a worker's ("compare", ...) here and
    holds its verdict to the findings (JobRun.held_to_server). A candidate's kernel can write to the inputs mapped
    into its process: after each candidate (release) the server checks the inputs' fingerprints and puts them back
    if they changed, and every candidate attached meanwhile is tainted (its verdict may rest on changed inputs: the
    caller runs it again on trials of its own). `failure`: why the server cannot serve (its reference failed: the
    verdict; inputs it could not put back: a message); callers then go without it."""

    def __init__(self, worker: Worker, job: dict, limits: dict, gate: Gate | None = None,
                 memory: Memory | None = None, gpu: int | None = None):
        self.worker, self.gate, self.memory, self.limit = worker, gate, memory, limits["run"]
        self.lock = threading.Lock()   # one request at a time on the server's pipe
        self.attached, self.tainted, self.tickets = set(), set(), 0
        run = JobRun(worker, dict(job, kind="serve"), limits, gate, memory, gpu)
        reply = run.run()   # (until the trials are made: ("served", count, bytes kept, a candidate's), or a verdict)
        self.granted = run.granted
        self.trials, self.failure = (reply[1], None) if run.kept else (0, reply)
        if not run.kept:
            self.worker = None   # (let go by run)
        elif memory is not None and self.granted is not None:
            # what making the trials took beyond what the server keeps (the heavy trial's temporaries) is free again
            self.granted = memory.shrink(self.granted, memory.by_key(*reply[2:4], gpu))
            # A server whose trials and one candidate do not fit the budget together serves nobody well: each
            # candidate would run beside it over the budget (ReLU over 6 GiB on an 80 GB GPU: 39 GiB kept, a
            # candidate's 54 GiB; out of memory). Then every candidate makes its own trials, alone if need be.
            candidate = memory.by_key(*reply[4:6], gpu)
            over = [key for key, v in candidate.items() if v + self.granted.get(key, 0) > memory.total[key]]
            if over:
                gib = lambda b: f"{b / 2**30:.1f} GiB"
                key = over[0]
                self.failure = (f"its trials ({gib(self.granted[key])} kept) and one candidate's part "
                                f"({gib(candidate[key])}) do not fit the memory budget ({gib(memory.total[key])}) "
                                f"together")
                self.close()

    def ask(self, request: tuple):
        """One request and its answer (callers hold the lock)."""
        try:
            self.worker.conn.send(request)
            if self.worker.conn.poll(self.limit):
                return self.worker.conn.recv()
        except (EOFError, OSError) as e:
            self.failure = f"{type(e).__name__} on its pipe (exit code {self.worker.exit_code(0.1)})"
            raise ServerFailed(self.failure) from e
        self.failure = f"no answer in {self.limit:.0f} s"
        raise ServerFailed(self.failure)

    def compare(self, trial: int, outputs: bytes) -> tuple:
        """compare()'s (error_kind, check, message, stats) for a candidate's outputs (shared tensors) on a trial."""
        with self.lock:
            return self.ask(("compare", trial, outputs))

    def attach(self) -> tuple[int, bytes]:
        """A candidate's job is about to map the inputs: its ticket for release, and the trials pickled for it (each
        pickling counts one more user of the shared memory: one per job)."""
        with self.lock:
            shared = self.ask(("share",))
            self.tickets += 1
            self.attached.add(self.tickets)
            return self.tickets, shared

    def release(self, ticket: int) -> bool:
        """The candidate's job is over and its process gone: whether its verdict is tainted (the inputs changed while
        it was attached). The fingerprints are read in a shared GPU turn (no timer runs meanwhile), taken before
        the lock: a candidate waiting for a comparison holds its turn, and a timer waits for it."""
        fd = self.gate.acquire("shared") if self.gate else None
        try:
            with self.lock:
                try:
                    intact, restored = self.ask(("intact",))
                except ServerFailed as e:
                    intact, restored, self.failure = False, False, str(e)
                if not intact:   # everyone attached since the last check may have computed on changed inputs
                    self.tainted |= self.attached
                    if not restored:
                        self.failure = self.failure or "the shared inputs changed and could not be put back"
                self.attached.discard(ticket)
                tainted = ticket in self.tainted
                self.tainted.discard(ticket)
                return tainted
        finally:
            if self.gate:
                self.gate.release("shared", fd)

    def close(self) -> None:
        if self.worker is None:
            return
        with contextlib.suppress(OSError):
            self.worker.conn.send(("end",))
        self.worker.kill(wait=False)
        if self.memory is not None and self.granted is not None:
            release_when_gone(self.memory, self.granted, self.worker.pid)
        self.worker = None


# ---------------------------------------------------------------------------------------------------------------------
# Running one job (worker side): the requests run_job answers, made from inside the worker

def gpu_turn(conn: Connection, mode: str) -> None:
    """Ask the parent for this worker's GPU, "shared" (correctness checks) or "exclusive" (timing), and wait until it
    is granted (see Gate). Asked in CPU mode too, where it is granted at once."""
    conn.send(("gpu", mode))
    conn.recv()


def pass_turn(conn: Connection, device: str, mode: str = "shared") -> None:
    """Give this worker's shared GPU turn back (its kernels finished first) and ask for `mode` again ("none": not at
    all): a timer waiting for the GPU gets it in between (the writer-preferring Gate)."""
    if device == "cuda":
        torch.cuda.synchronize()   # our kernels finish before another worker may time
    gpu_turn(conn, mode)


def yield_turn(conn: Connection, device: str) -> None:
    """Between two trials (or reference outputs): give the shared GPU turn back if a timer waits for the GPU, so that
    it waits for one trial of each holder, not for their whole checks. The parent knows whether one waits (Gate.
    timer_waiting); most of the time none does, and then the turn is kept, without the host sync a pass needs."""
    conn.send(("timer?",))
    if conn.recv():
        pass_turn(conn, device)


def ask_memory(conn: Connection, host: int, device: int, details: dict) -> None:
    """Wait until the parent admits this job's memory (Memory, through run_job); granted at once without a budget."""
    details["mem_need_mb"] = [round(host / 2**20), round(device / 2**20)]
    conn.send(("mem", host, device))
    conn.recv()
