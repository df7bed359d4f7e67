"""Several Triton servers behind one remote binding: which server takes the next request, which
servers are in rotation, and the probes that bring a server back.

- `Server`: one server of a binding: its connection, the model configuration it declared, its
  health and its counters (`ServerCounters` is a snapshot of them).
- `Balancer`: picks the server for each attempt (least outstanding requests, ties broken
  round-robin), takes a server that failed with a transient error out of rotation, and probes it
  from a thread of its own until it is ready again.

Balancing. Each attempt goes to the server in rotation with the fewest requests outstanding (sent
by this binding and not yet answered); among equals, to the next one after the server picked last,
so that one thread's calls, which never overlap, still go round every server. The pick and the
count of the request it adds happen under one lock, so concurrent calls spread as they arrive.

Health. A server whose attempt failed with a transient error (unreachable, the connection lost, a
deadline passed) is taken out of rotation. A thread of the balancer's own, started then and ended
when every server is back, probes it `probe_interval` seconds later with Triton's readiness calls
(`is_server_ready`, then `is_model_ready` for the served model); each failed probe doubles the wait,
up to 8 x `probe_interval`. A server that passes (and failed no attempt after the probe began) is
back in rotation, as is one that answers any attempt. A server that answers an attempt with an
error (the event's own fault, say) stays in rotation; one that refuses the binding itself (it does
not serve the model, or refuses the shared memory the binding requires) is taken out as a failed
one is, so that calls go to the others and it comes back once it passes a probe.

Registrations. Shared-memory regions are registered with each server separately (`generation`
counts the times a server may have forgotten them: each transient failure); a region that is no
longer used while it is registered with a server out of rotation is unregistered there once that
server is back in rotation (`stale`), by the probing thread; one a request may still be using
there (it got no answer) is unregistered there only the request's deadline (`timeout`) after the
call gave up on it, or once the server is back if it is out then (`deferred`, `defer`).

Importing this module imports nothing heavy; it talks to servers only through the functions it is
given.
"""

from __future__ import annotations

import threading
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# The longest wait between two probes of a server, in multiples of `probe_interval`.
PROBE_BACKOFF_LIMIT = 8


@dataclass(frozen=True)
class ServerCounters:
    """What a remote binding has done with one of its servers (counts since it was made)."""

    url: str
    sent: int  # attempts made on it (the requests sent, and those that failed before they left)
    succeeded: int  # attempts answered with a response that fits the output blocks
    failed: int  # attempts that failed with a transient error (the first of them took it out)
    errors: int  # attempts it answered with an error or a response that does not fit, or refused
    retried_elsewhere: int  # calls that moved on to another server after it failed or refused
    taken_out: int  # times it was taken out of rotation
    probes: int  # readiness probes made while it was out of rotation
    healthy: bool  # whether it is in rotation now
    outstanding: int  # attempts on it in progress now
    last_error: str  # the last transient failure (or failed probe), "" before any


@dataclass(eq=False)
class Server:
    """One server of a binding. The health and counter fields change under `Balancer.lock`."""

    slot: int  # its position in the binding's list of URLs
    url: str
    client: typing.Any  # tritonclient.grpc.InferenceServerClient
    headers: dict[str, str] | None  # the access token's header, where one is given
    shared_memory: bool  # whether calls send it their blocks through shared memory
    configuration: typing.Any = None  # what the server declares (the client's business)
    configure_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    healthy: bool = True
    outstanding: int = 0
    generation: int = 0  # bumped when it may have forgotten its shared-memory registrations
    failed_at: float = 0.0  # time.monotonic() of its last transient failure
    next_probe: float = 0.0
    wait: float = 0.0  # the pause before its next probe
    probing: bool = False
    stale: list[typing.Any] = field(default_factory=list)  # regions to unregister once it is back
    # Regions a request may still be using there (`Balancer.defer`), not to unregister yet.
    deferred: list[typing.Any] = field(default_factory=list)
    last_error: str = ""
    sent: int = 0
    succeeded: int = 0
    failed: int = 0
    errors: int = 0
    retried_elsewhere: int = 0
    taken_out: int = 0
    probes: int = 0

    def counters(self) -> ServerCounters:
        return ServerCounters(
            url=self.url,
            sent=self.sent,
            succeeded=self.succeeded,
            failed=self.failed,
            errors=self.errors,
            retried_elsewhere=self.retried_elsewhere,
            taken_out=self.taken_out,
            probes=self.probes,
            healthy=self.healthy,
            outstanding=self.outstanding,
            last_error=self.last_error,
        )


class Balancer:
    """The servers of one binding, the choice among them, and their probes.

    `probe(server)` raises unless the server is ready (it runs on the probing thread);
    `unregister(server, region)` unregisters a region that is no longer used from a server back in
    rotation (it may raise; the error is ignored). Neither may hold the binding itself, so that
    the binding can be collected while the thread runs.
    """

    def __init__(
        self,
        servers: Sequence[Server],
        *,
        probe_interval: float,
        probe: Callable[[Server], None],
        unregister: Callable[[Server, typing.Any], None],
    ) -> None:
        self.servers = tuple(servers)
        self.probe_interval = probe_interval
        self._probe = probe
        self._unregister = unregister
        self.lock = threading.Condition()
        self._cursor = 0  # where the round-robin among equally loaded servers goes on
        self._prober: threading.Thread | None = None
        self._timers: set[threading.Timer] = set()  # the waits of `defer` not over
        self._closed = False

    # The choice.

    def pick(self, tried: typing.Collection[int], *, first: bool) -> Server | None:
        """The server for a call's next attempt, its request counted as outstanding: the server in
        rotation, not in `tried`, with the fewest outstanding requests (ties: round-robin). When no
        server is in rotation at all and this is a round's `first` pick, the one out of rotation
        that failed longest ago (a call then still tries a server, as it would with one URL); else
        None."""
        with self.lock:
            count = len(self.servers)
            chosen: Server | None = None
            for step in range(count):
                server = self.servers[(self._cursor + step) % count]
                if server.healthy and server.slot not in tried:
                    if chosen is None or server.outstanding < chosen.outstanding:
                        chosen = server
            if chosen is not None:
                self._cursor = (chosen.slot + 1) % count
            elif first and not any(server.healthy for server in self.servers):
                waiting = [server for server in self.servers if server.slot not in tried]
                if waiting:
                    chosen = min(waiting, key=lambda server: server.failed_at)
            if chosen is not None:
                chosen.outstanding += 1
                chosen.sent += 1
            return chosen

    def answered(self, server: Server, *, accepted: bool) -> None:
        """The attempt on `server` got an answer: a response whose outputs are written
        (`accepted`), or an error the server answered with. Either way the server is up: back in
        rotation if it was out."""
        with self.lock:
            server.outstanding -= 1
            if accepted:
                server.succeeded += 1
            else:
                server.errors += 1
            if not server.healthy:
                self._bring_back(server)

    def abandoned(self, server: Server) -> None:
        """The attempt ended without an answer, for a reason of the client's (an exception of its
        own): counted as an error, the server's health unchanged."""
        with self.lock:
            server.outstanding -= 1
            server.errors += 1

    def failed(self, server: Server, error: str) -> None:
        """The attempt on `server` failed with a transient error: out of rotation, to be probed."""
        with self.lock:
            server.outstanding -= 1
            server.failed += 1
            # A restarted server forgot the regions registered with it, and may serve another
            # form of the model: both are found again at its next attempt.
            server.generation += 1
            server.configuration = None
            self._take_out(server, error)

    def refused(self, server: Server, error: str) -> None:
        """`server` refused the binding itself (it does not serve the model, or refuses the shared
        memory the binding requires): counted as an error, out of rotation, to be probed."""
        with self.lock:
            server.outstanding -= 1
            server.errors += 1
            self._take_out(server, error)

    def moved_on(self, server: Server) -> None:
        """A call whose attempt on `server` failed goes on to another server."""
        with self.lock:
            server.retried_elsewhere += 1

    def retire(self, server: Server, region: typing.Any) -> bool:
        """`region` is no longer used and is registered with `server`. Out of rotation, the server
        keeps it until it is back, when the probing thread unregisters it (True); in rotation,
        False: the caller unregisters it now. Decided under the lock, so that a server that comes
        back meanwhile cannot leave it behind with no thread to unregister it."""
        with self.lock:
            if server.healthy:
                return False
            server.stale.append(region)
            self.lock.notify_all()
            return True

    def defer(self, server: Server, region: typing.Any, seconds: float) -> None:
        """`region` is no longer used, but a request on it that got no answer may still run on
        `server`: unregistered there `seconds` later (the client's deadline for that request,
        past which a server has most often answered or dropped it), or once the server is back
        if it is out then. `close()` stops the waits; its caller unregisters what is left in
        `server.deferred` (a region may be unregistered twice: the second finds nothing)."""
        with self.lock:
            if self._closed:
                return
            server.deferred.append(region)
            timer = threading.Timer(seconds, self._end_deferral, (server, region))
            timer.daemon = True
            self._timers.add(timer)
        timer.start()

    def counters(self) -> list[ServerCounters]:
        with self.lock:
            return [server.counters() for server in self.servers]

    def close(self, timeout: float | None = None) -> None:
        """Stop probing (waiting at most `timeout` seconds for a probe in progress) and the waits of
        `defer`: their regions stay in `deferred`, and with those in `stale` are the caller's to
        unregister."""
        with self.lock:
            self._closed = True
            prober = self._prober
            timers, self._timers = self._timers, set()
            self.lock.notify_all()
        for timer in timers:
            timer.cancel()  # a wait not over: its region is in `deferred` still
        if prober is not None and prober is not threading.current_thread() and timeout:
            prober.join(timeout)

    def _end_deferral(self, server: Server, region: typing.Any) -> None:
        with self.lock:
            self._timers.discard(typing.cast(threading.Timer, threading.current_thread()))
            if self._closed or region not in server.deferred:
                return
            if self.retire(server, region):  # out of rotation: unregistered once it is back
                server.deferred.remove(region)
                return
        try:
            self._unregister(server, region)
        except Exception:
            pass  # the server lost it, or is gone: nothing left to free
        with self.lock:
            # Left in `deferred` until now, so that a `close()` meanwhile unregisters it too.
            if region in server.deferred:
                server.deferred.remove(region)

    # Health, and the probing thread.

    def _take_out(self, server: Server, error: str) -> None:
        """Out of rotation, probed by the probing thread (started here where none runs); under
        the lock. While a server is out and the balancer open, the thread runs."""
        now = time.monotonic()
        server.failed_at = now
        server.last_error = error
        if server.healthy:
            server.healthy = False
            server.taken_out += 1
            server.wait = self.probe_interval
            server.next_probe = now + server.wait
        if self._closed:
            return
        if self._prober is None:
            self._prober = threading.Thread(
                target=self._probe_loop, name="soagen-remote-probe", daemon=True
            )
            self._prober.start()
        self.lock.notify_all()

    def _bring_back(self, server: Server) -> None:
        server.healthy = True
        server.wait = 0.0
        self.lock.notify_all()  # its stale registrations can go now

    def _probe_loop(self) -> None:
        while True:
            with self.lock:
                while True:
                    if self._closed:
                        self._prober = None
                        return
                    now = time.monotonic()
                    due = [
                        server
                        for server in self.servers
                        if not server.healthy and not server.probing and server.next_probe <= now
                    ]
                    cleanups = [
                        (server, server.stale.pop())
                        for server in self.servers
                        if server.healthy and server.stale
                    ]
                    if due or cleanups:
                        break
                    waiting = [server.next_probe for server in self.servers if not server.healthy]
                    if not waiting:
                        self._prober = None
                        return
                    self.lock.wait(max(0.0, min(waiting) - now))
                for server in due:
                    server.probing = True
            for server, region in cleanups:
                try:
                    self._unregister(server, region)
                except Exception:
                    pass  # the server lost it, or is gone again: nothing left to free
            for server in due:
                begun = time.monotonic()
                try:
                    self._probe(server)
                except Exception as error:
                    problem: str | None = f"probe: {error}"
                else:
                    problem = None
                with self.lock:
                    server.probing = False
                    server.probes += 1
                    if server.healthy:
                        continue  # an attempt got an answer meanwhile
                    if problem is None and server.failed_at <= begun:
                        self._bring_back(server)
                        continue
                    # Not ready, or an attempt failed after the probe began: that is the newer
                    # word on the server.
                    if problem is not None:
                        server.last_error = problem
                    server.wait = min(2 * server.wait, PROBE_BACKOFF_LIMIT * self.probe_interval)
                    server.next_probe = time.monotonic() + server.wait
